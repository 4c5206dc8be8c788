"""A result the env server cannot send (an env's observations over its gRPC message limit) is an in-band
``ResourceExhaustedError`` naming the session and the limit: on the ``Session`` stream it used to end the stream,
and the server closed every session on it (each client then saw ``SessionLostError``)."""

from __future__ import annotations

import pytest

from marti.clients.env import EnvClient
from marti.env.config import ConfigField, ConfigSchema
from marti.env.registry import EnvSpec, Registry
from marti.errors import ResourceExhaustedError, SessionLostError
from tests.integration.env.two_text_agents import TwoTextAgents, serve_registry

LIMIT = 256 * 1024  # the server's max_message_bytes in these tests
BIG = 2 * LIMIT  # characters of the observation a "big" action asks for


class EchoEnv(TwoTextAgents):
    """Each step's observation is ``"x" * BIG`` when an action says ``big``, else ``"ok"``."""

    max_chars = 4 * BIG

    def step(self, actions):
        text = "x" * BIG if "big" in actions.values() else "ok"
        live = self.agents
        return ({a: text for a in live}, {a: 0.0 for a in live}, {a: False for a in live},
                {a: False for a in live}, {a: {} for a in live})  # fmt: skip


@pytest.fixture
def address():
    registry = Registry()
    schema = ConfigSchema((ConfigField("max_action_chars", "int", 64, "longest action"),))
    registry.register(EnvSpec("echo_size", 1, EchoEnv, schema, "observations of a chosen size"))
    with serve_registry(registry, max_message_bytes=LIMIT) as address:
        yield address


def test_a_step_result_over_the_limit_keeps_the_stream_and_its_sessions(address):
    with EnvClient(address, timeout_s=10) as client:
        stream = client.stream()
        try:
            a = stream.create_session("echo_size").session_id
            b = stream.create_session("echo_size").session_id
            stream.reset(a)
            stream.reset(b)
            with pytest.raises(ResourceExhaustedError, match=f"max_message_bytes={LIMIT}") as err:
                stream.step(a, {"a": "big", "b": ""})
            assert a in str(err.value) and not isinstance(err.value, SessionLostError)
            assert stream.step(b, {"a": "small", "b": ""}).observations == {"a": "ok", "b": "ok"}
            assert stream.step(a, {"a": "small", "b": ""}).observations == {"a": "ok", "b": "ok"}
            assert stream.generation == 1 and not stream.broken
        finally:
            stream.close()


def test_a_batch_over_the_limit_fails_only_its_large_items(address):
    """Each result fits alone but not all together: the largest fail in-band (each naming its session), the
    others come back; on the stream and over the unary BatchStep."""
    with EnvClient(address, timeout_s=10) as client:
        stream = client.stream()
        try:
            for call in (stream, client):
                ids = [call.create_session("echo_size").session_id for _ in range(3)]
                for sid in ids:
                    call.reset(sid)
                got = call.batch_step(
                    [
                        (ids[0], {"a": "small", "b": ""}),
                        (ids[1], {"a": "big", "b": ""}),
                        (ids[2], {"a": "x", "b": ""}),
                    ]
                )
                assert got[0].observations == {"a": "ok", "b": "ok"}
                assert isinstance(got[1], ResourceExhaustedError) and ids[1] in str(got[1])
                assert got[2].observations == {"a": "ok", "b": "ok"}
            assert stream.generation == 1 and not stream.broken
        finally:
            stream.close()


def test_a_unary_step_over_the_limit_names_the_session(address):
    with EnvClient(address, timeout_s=10) as client:
        sid = client.create_session("echo_size").session_id
        client.reset(sid)
        with pytest.raises(ResourceExhaustedError, match=f"max_message_bytes={LIMIT}") as err:
            client.step(sid, {"a": "big", "b": ""})
        assert sid in str(err.value)
        assert client.step(sid, {"a": "small", "b": ""}).observations == {"a": "ok", "b": "ok"}
