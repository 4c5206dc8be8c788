"""Tensors of every numpy dtype kind, well- and ill-formed, get a documented status: OK or INVALID_ARGUMENT.

A ``marti.api.env.v1.Tensor`` may arrive in an env config (``CreateSession``), reset options (``Reset``)
and actions (``Step``). Its dtype may be of any kind numpy knows (b i u f c m M O S U V, plus names numpy
refuses), zero-size (``"str"``, ``"U"``, ``"S"``, ``"V"``), and its shape may disagree with its bytes. The
codec (:func:`marti.codec.env.tensor_from_proto`) accepts bool, integer, unsigned, float, complex,
timedelta and datetime items and refuses the rest with ``InvalidArgumentError`` naming the dtype; no tensor
makes a server answer INTERNAL.

``MARTI_FUZZ_EXAMPLES`` sets the examples per test (default 25).
"""

from __future__ import annotations

import os

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from marti.api.env.v1 import env_pb2 as epb
from marti.api.env.v1 import env_service_pb2_grpc as egrpc
from marti.codec.env import TENSOR_KINDS, tensor_from_proto, tensor_to_proto
from marti.errors import InvalidArgumentError
from marti.rpc.settings import ServerSettings
from marti.rpc.testing import serve_in_thread

from .protofuzz import DTYPES_BY_KIND, tensor_strategy

EXAMPLES = int(os.environ.get("MARTI_FUZZ_EXAMPLES", "25"))
ENV_ID = "collaborative_task_solving-v1"
#: Every kind letter numpy documents for ``dtype.kind``.
NUMPY_KINDS = set("biufcmMOSUV")
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def env_stub():
    """An env server on a free port; yields ``(stub, session id, an agent id)``."""
    from services.env_server.servicer import env_service
    from services.env_server.settings import EnvServerSettings

    with serve_in_thread(lambda: [env_service(EnvServerSettings(port=0))], ServerSettings(port=0)) as server:
        channel = grpc.insecure_channel(server.address)
        stub = egrpc.EnvServiceStub(channel)
        created = stub.CreateSession(epb.CreateSessionRequest(env_id=ENV_ID, seed=1), timeout=5)
        yield stub, created.session_id, created.agents[0].agent
        channel.close()


def _code(fn) -> tuple[grpc.StatusCode, str]:
    try:
        fn()
        return grpc.StatusCode.OK, ""
    except grpc.RpcError as err:
        return err.code(), err.details() or ""


def _statuses(env_stub, tensor: epb.Tensor) -> dict[str, tuple[grpc.StatusCode, str]]:
    """Send ``tensor`` as a config value, a nested config value, a reset option and an action."""
    stub, session_id, agent = env_stub
    out = {}
    req = epb.CreateSessionRequest(env_id=ENV_ID)
    req.config.fields["max_turns"].tensor.CopyFrom(tensor)
    out["CreateSession"] = _code(lambda: stub.CloseSession(epb.CloseSessionRequest(
        session_id=stub.CreateSession(req, timeout=5).session_id), timeout=5))  # fmt: skip
    nested = epb.CreateSessionRequest(env_id=ENV_ID)
    nested.config.fields["scenario"].list.values.add().map.fields["x"].tensor.CopyFrom(tensor)
    out["CreateSession/nested"] = _code(lambda: stub.CreateSession(nested, timeout=5))
    reset = epb.ResetRequest(session_id=session_id, seed=1)
    reset.options.fields["x"].tensor.CopyFrom(tensor)
    out["Reset"] = _code(lambda: stub.Reset(reset, timeout=5))
    stub.Reset(epb.ResetRequest(session_id=session_id, seed=1), timeout=5)
    step = epb.StepRequest(session_id=session_id, actions=[epb.AgentAction(agent=agent)])
    step.actions[0].action.tensor.CopyFrom(tensor)
    out["Step"] = _code(lambda: stub.Step(step, timeout=5))
    return out


def _assert_documented(env_stub, tensor: epb.Tensor) -> None:
    for rpc, (code, details) in _statuses(env_stub, tensor).items():
        assert code in (grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT), (rpc, tensor, code, details)


def test_the_strategy_covers_every_numpy_kind():
    kinds = set()
    for names in DTYPES_BY_KIND.values():
        for name in names:
            try:
                kinds.add(np.dtype(name).kind)
            except Exception:  # noqa: BLE001 - names numpy refuses, in any of its ways
                pass
    assert NUMPY_KINDS <= kinds, NUMPY_KINDS - kinds


@pytest.mark.parametrize("dtype", ["str", "U", "S", "V", "S0", "U0", "V0", "O", "T", "i4,i4", "(2,)i4"])
def test_issue_example_zero_size_and_unsupported_dtypes_are_invalid_argument(env_stub, dtype):
    """The reported case: ``config.fields["max_turns"].tensor.dtype = "str"`` answered INTERNAL."""
    tensor = epb.Tensor(dtype=dtype)
    for rpc, (code, details) in _statuses(env_stub, tensor).items():
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (rpc, code, details)
        assert repr(dtype) in details, (rpc, details)


@pytest.mark.parametrize("kind", sorted(DTYPES_BY_KIND))
def test_every_kind_with_matching_and_mismatched_bytes(env_stub, kind):
    for name in DTYPES_BY_KIND[kind]:
        for shape in ((), (2,), (0, 3), (1, -1), (2**62, 2**62, 0)):
            try:
                size = int(np.prod(shape)) * np.dtype(name).itemsize if all(d >= 0 for d in shape) else 0
            except Exception:  # noqa: BLE001
                size = 0
            for data in (b"\x01" * max(size, 0), b"\x01" * (size + 1)):
                _assert_documented(env_stub, epb.Tensor(dtype=name, shape=shape, data=data[:4096]))


@FUZZ
@given(tensor_strategy())
def test_codec_decodes_or_refuses_naming_the_dtype(tensor):
    try:
        arr = tensor_from_proto(tensor)
    except InvalidArgumentError as err:
        assert repr(tensor.dtype[:64]) in str(err), (tensor, err)
        return
    assert isinstance(arr, np.ndarray) and arr.dtype.kind in TENSOR_KINDS
    assert arr.shape == tuple(tensor.shape)
    # what decodes encodes back to the same bytes (the wire's little-endian, C order)
    again = tensor_to_proto(arr)
    assert tuple(again.shape) == tuple(tensor.shape)
    if arr.dtype.kind != "b":
        assert again.data == tensor.data


def test_codec_round_trips_every_accepted_kind():
    for kind in TENSOR_KINDS:
        for name in DTYPES_BY_KIND[kind]:
            if name == "M8":  # a datetime without a unit holds only NaT: refused both ways
                with pytest.raises(InvalidArgumentError, match="need a unit"):
                    tensor_to_proto(np.array(["NaT"], dtype=name))
                continue
            arr = np.arange(6).reshape(2, 3).astype(name)
            back = tensor_from_proto(tensor_to_proto(arr))
            assert back.dtype == arr.dtype.newbyteorder("=") or back.dtype == arr.dtype, name
            np.testing.assert_array_equal(back, arr)


@pytest.mark.parametrize("dtype", ["U3", "S2", "V4", "i4,i4", "O"])
def test_encoder_refuses_what_the_decoder_refuses(dtype):
    with pytest.raises(InvalidArgumentError, match="dtype"):
        tensor_to_proto(np.zeros(2, dtype=dtype))


@FUZZ
@given(tensor_strategy())
def test_env_rpcs_answer_ok_or_invalid_argument_for_any_tensor(env_stub, tensor):
    _assert_documented(env_stub, tensor)
