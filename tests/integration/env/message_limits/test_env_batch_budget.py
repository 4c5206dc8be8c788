"""How the env server fits a ``BatchStep`` under a small told receive limit (``marti-max-receive-bytes``): only
step results are failed to make room (an item that already carries an error keeps it), a batch still over the
limit with every result failed fails whole, and a limit under the 1 KiB kept around a result fails every result
(RESOURCE_EXHAUSTED naming the limit)."""

from __future__ import annotations

import grpc
import pytest

from marti.api.env.v1 import env_pb2 as pb
from marti.api.env.v1 import env_service_pb2_grpc as pb_grpc
from marti.clients.env.protocol import _step_request
from marti.errors import ResourceExhaustedError
from marti.rpc.client.calls import call
from marti.rpc.client.message_limits import RECEIVE_LIMIT_KEY
from tests.integration.env.message_limits.oversized import BIG_STEP
from tests.integration.env.two_text_agents import serve_echo

#: A big step observes this many characters per agent: a result of about 4 KB.
MID = 2000
#: A session id the server does not know, long enough that its NOT_FOUND item is larger than any result.
LOST = "gone-" + "z" * 6000


@pytest.fixture(scope="module")
def stub():
    with serve_echo("echo_mid", MID) as address, grpc.insecure_channel(address) as channel:
        yield pb_grpc.EnvServiceStub(channel)


def _batch(stub, ids: list[str], told: int | None) -> pb.BatchStepResponse:
    """A ``BatchStep`` of a big step of each of ``ids``, telling ``told`` (``None``: nothing)."""
    req = pb.BatchStepRequest(steps=[_step_request(sid, BIG_STEP, None) for sid in ids])
    return call(stub.BatchStep, req, 20, () if told is None else ((RECEIVE_LIMIT_KEY, str(told)),))


def _sessions(stub, n: int) -> list[str]:
    """``n`` new reset ``echo_mid`` sessions."""
    ids = [
        call(stub.CreateSession, pb.CreateSessionRequest(env_id="echo_mid"), 20).session_id for _ in range(n)
    ]
    for sid in ids:
        call(stub.Reset, pb.ResetRequest(session_id=sid), 20)
    return ids


def test_an_item_that_already_failed_keeps_its_error_when_results_are_failed_to_fit(stub):
    """The unknown session's NOT_FOUND item is the largest; room is made by failing the two results instead."""
    ids = [LOST, *_sessions(stub, 2)]
    lost = _batch(stub, ids, None).items[0]
    assert lost.status.code == grpc.StatusCode.NOT_FOUND.value[0]
    # room for the lost item and two failed results, not for one whole result more
    got = _batch(stub, ids, 1024 + lost.ByteSize() + 2500)
    assert got.items[0] == lost
    for sid, item in zip(ids[1:], got.items[1:], strict=True):
        assert not item.HasField("step") and item.status.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
        assert sid in item.status.message
        assert f"client's receive limit, {1024 + lost.ByteSize() + 2500} bytes" in item.status.message


def test_a_batch_still_over_the_limit_with_every_result_failed_fails_whole(stub):
    told = 1024 + 300  # under the lost item's error and a failed result's
    with pytest.raises(ResourceExhaustedError) as err:
        _batch(stub, ["gone", *_sessions(stub, 1)], told)
    assert "the BatchStep response of 2 steps, with every step result failed" in str(err.value)
    assert f"client's receive limit, {told} bytes" in str(err.value)
    assert "too many steps for that limit" in str(err.value)


@pytest.mark.parametrize("told", [0, 10, 1024])
def test_a_told_limit_under_the_margin_fails_every_result_naming_it(stub, told):
    """Step and BatchStep alike: the whole call is RESOURCE_EXHAUSTED naming the limit and the margin."""
    sid = _sessions(stub, 1)[0]
    with pytest.raises(ResourceExhaustedError) as err:
        call(
            stub.Step,
            _step_request(sid, {"a": "small", "b": ""}, None),
            20,
            ((RECEIVE_LIMIT_KEY, str(told)),),
        )
    with pytest.raises(ResourceExhaustedError) as batch_err:
        _batch(stub, [sid], told)
    for error in (err.value, batch_err.value):
        assert f"client's receive limit, {told} bytes" in str(error)
        assert "not over the 1024 bytes kept around a result, so every result is too large" in str(error)
