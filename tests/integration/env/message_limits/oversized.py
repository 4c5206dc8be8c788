"""Checks shared by the tests of results too large to send (``test_env_result_size.py``, the server's limit;
``test_env_receive_limit.py``, the client's): such a result fails in-band for its own session, and the stream,
its other sessions and that session go on."""

from __future__ import annotations

import pytest

from marti.clients.env import EnvClient
from marti.errors import ResourceExhaustedError, SessionLostError

#: Actions of a step observing ``"ok"``, and of one observing the env's big text (``serve_echo``).
SMALL_STEP = {"a": "small", "b": ""}
BIG_STEP = {"a": "big", "b": ""}
#: What a small step observes.
OK = {"a": "ok", "b": "ok"}


def check_stream_step(client: EnvClient, env_id: str, match: str) -> ResourceExhaustedError:
    """On a new stream of ``client``, two ``env_id`` sessions: a big step of the first raises
    ``ResourceExhaustedError`` matching ``match`` and naming the session; both sessions then step, the first
    closes, and the stream is still its first one. Returns the error."""
    stream = client.stream()
    try:
        a = stream.create_session(env_id).session_id
        b = stream.create_session(env_id).session_id
        stream.reset(a)
        stream.reset(b)
        with pytest.raises(ResourceExhaustedError, match=match) as err:
            stream.step(a, BIG_STEP)
        assert a in str(err.value) and not isinstance(err.value, SessionLostError)
        assert stream.step(b, SMALL_STEP).observations == OK
        assert stream.step(a, SMALL_STEP).observations == OK
        assert stream.close_session(a) is True
        assert stream.generation == 1 and not stream.broken
        return err.value
    finally:
        stream.close()


def check_batches(client: EnvClient, env_id: str) -> list[ResourceExhaustedError]:
    """On a stream of ``client`` and over its unary ``BatchStep``, a batch of a small, a big and a small step of
    three ``env_id`` sessions fails the big one alone, in-band and naming its session; that session steps on
    after it, and the stream is still its first one. Returns the two errors (stream, unary)."""
    stream = client.stream()
    errors = []
    try:
        for calls in (stream, client):
            ids = [calls.create_session(env_id).session_id for _ in range(3)]
            for sid in ids:
                calls.reset(sid)
            got = calls.batch_step([(ids[0], SMALL_STEP), (ids[1], BIG_STEP), (ids[2], {"a": "x", "b": ""})])
            assert got[0].observations == OK and got[2].observations == OK
            assert isinstance(got[1], ResourceExhaustedError) and ids[1] in str(got[1])
            assert calls.step(ids[1], SMALL_STEP).observations == OK
            errors.append(got[1])
        assert stream.generation == 1 and not stream.broken
        return errors
    finally:
        stream.close()


def check_unary_step(client: EnvClient, env_id: str, match: str) -> ResourceExhaustedError:
    """A unary big step of a new ``env_id`` session raises ``ResourceExhaustedError`` matching ``match`` and
    naming the session; the session then steps and closes. Returns the error."""
    sid = client.create_session(env_id).session_id
    client.reset(sid)
    with pytest.raises(ResourceExhaustedError, match=match) as err:
        client.step(sid, BIG_STEP)
    assert sid in str(err.value)
    assert client.step(sid, SMALL_STEP).observations == OK
    assert client.close_session(sid) is True
    return err.value
