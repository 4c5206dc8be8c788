"""Bad input, systematically: hypothesis-built requests with hostile values and random bytes at every rpc.

Every rpc of every service gets (a) messages built from its request descriptor (empty, huge, NaN,
negative, unicode, unknown enum numbers, nested up to 4 levels) and (b) random byte strings sent through a
raw channel with identity serializers. Each answer must be a documented status code (see ``ALLOWED``:
never UNKNOWN, INTERNAL from a servicer, UNAVAILABLE or a dropped connection), every call must end by its
deadline, and after each rpc's run the server still reports SERVING and answers a canary call.

``MARTI_FUZZ_EXAMPLES`` sets the examples per rpc and kind (default 25); the slow variant runs
``MARTI_FUZZ_LONG_FACTOR`` times as many (default 4; 10 for a deeper run outside the suite's time budget).
Counts per rpc are printed at the end of the module and written to ``$MARTI_FUZZ_REPORT`` (JSON) if set;
docs/reliability.md records a run.
"""

from __future__ import annotations

import collections
import json
import os

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from security.stack import METHOD_IDS, METHODS, all_specs, call_raw, request_class

from marti.api.broker.v1 import broker_service_pb2 as bpb
from marti.api.broker.v1 import broker_service_pb2_grpc as bgrpc
from marti.api.env.v1 import env_pb2 as epb
from marti.api.env.v1 import env_service_pb2_grpc as egrpc
from marti.rpc.settings import ServerSettings
from marti.rpc.testing import serve_in_thread

from .protofuzz import message_strategy

EXAMPLES = int(os.environ.get("MARTI_FUZZ_EXAMPLES", "25"))
#: How many times EXAMPLES the slow long run tries per rpc and kind.
LONG_FACTOR = int(os.environ.get("MARTI_FUZZ_LONG_FACTOR", "4"))
#: Deadline of each fuzz call, seconds: long polls and waits end with DEADLINE_EXCEEDED, never hang.
CALL_TIMEOUT_S = 0.5
#: Status codes a servicer may answer to bad input (docs/reliability.md, "Status codes").
ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
}
#: Codes the grpc runtime itself gives a request that does not parse as the request type.
COUNTS: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)


@pytest.fixture(scope="module")
def fuzz_target(tmp_path_factory):
    """All four services in one server; yields ``(address, known values per field name)``."""
    tmp = tmp_path_factory.mktemp("fuzz")
    with serve_in_thread(lambda: all_specs(str(tmp)), ServerSettings(host="127.0.0.1", port=0)) as server:
        channel = grpc.insecure_channel(server.address)
        env = egrpc.EnvServiceStub(channel)
        env_ids = [e.env_id for e in env.ListEnvs(epb.ListEnvsRequest()).envs]
        session_id = env.CreateSession(epb.CreateSessionRequest(env_id=env_ids[0], seed=1)).session_id
        bgrpc.BrokerServiceStub(channel).CreateSession(
            bpb.CreateSessionRequest(session="fz", agents=["a", "b"])
        )
        known = {
            "env_id": env_ids,
            "session_id": [session_id],
            "session": ["fz"],
            "agent_id": ["a", "b"],
            "sender": ["a"],
            "receivers": ["b"],
            "table": ["default"],
            "tables": ["default"],
        }
        yield server.address, known
        channel.close()
    _report()


def _report() -> None:
    if not COUNTS:
        return
    lines = [f"{'rpc':45s} {'proto':>6s} {'bytes':>6s}  codes"]
    for rpc in sorted(COUNTS):
        c = COUNTS[rpc]
        codes = "; ".join(
            kind
            + " "
            + ", ".join(f"{k.split(':', 1)[1]}={v}" for k, v in sorted(c.items()) if k.startswith(kind + ":"))
            for kind in ("proto", "bytes")
        )
        lines.append(f"{rpc:45s} {c['proto']:6d} {c['bytes']:6d}  {codes}")
    print("\n" + "\n".join(lines))
    path = os.environ.get("MARTI_FUZZ_REPORT")
    if path:
        with open(path, "w") as fh:
            json.dump({k: dict(v) for k, v in COUNTS.items()}, fh, indent=1, sort_keys=True)


def _alive(address: str) -> None:
    channel = grpc.insecure_channel(address)
    try:
        status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5).status
        assert status == health_pb2.HealthCheckResponse.SERVING
        assert egrpc.EnvServiceStub(channel).ListEnvs(epb.ListEnvsRequest(), timeout=5).envs
    finally:
        channel.close()


def _run(address, service, method, requests: list[bytes], kind: str, parses: bool) -> None:
    channel = grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 64 << 20)])
    try:
        code, details = call_raw(channel, service, method, requests, timeout_s=CALL_TIMEOUT_S)
    finally:
        channel.close()
    rpc = f"{service.name}/{method.name}"
    COUNTS[rpc][kind] += 1
    COUNTS[rpc][f"{kind}:{code.name}"] += 1
    if parses:
        assert code in ALLOWED, (rpc, code, details)
    else:
        # Bytes that do not decode as the request type: the interceptor answers INVALID_ARGUMENT naming the type.
        assert code in ALLOWED, (rpc, code, details)
        if code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("request is not a valid"):
            assert method.input_type.name in details, (rpc, details)


def _fuzz_messages(fuzz_target, service, method, examples: int) -> None:
    address, known = fuzz_target
    strategy = message_strategy(method.input_type, known=known)
    n_requests = st.integers(1, 3) if method.client_streaming else st.just(1)

    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(strategy, min_size=1, max_size=3), n_requests)
    def check(messages, n):
        _run(address, service, method, [m.SerializeToString() for m in messages[:n]], "proto", True)

    check()
    _alive(address)


def _fuzz_bytes(fuzz_target, service, method, examples: int) -> None:
    address, _ = fuzz_target
    cls = request_class(method)

    def parses(data: bytes) -> bool:
        try:
            cls().ParseFromString(data)
            return True
        except Exception:  # noqa: BLE001 - DecodeError and friends
            return False

    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.one_of(st.binary(max_size=512), st.sampled_from([b"\xff" * 10, b"\x0a\xff\xff\xff\xff\x0f"])))
    def check(data):
        _run(address, service, method, [data], "bytes", parses(data))

    check()
    _alive(address)


@pytest.mark.parametrize(("service", "method"), METHODS, ids=METHOD_IDS)
def test_hostile_messages_get_documented_codes(fuzz_target, service, method):
    _fuzz_messages(fuzz_target, service, method, EXAMPLES)


@pytest.mark.parametrize(("service", "method"), METHODS, ids=METHOD_IDS)
def test_random_bytes_get_documented_codes(fuzz_target, service, method):
    _fuzz_bytes(fuzz_target, service, method, EXAMPLES)


@pytest.mark.slow
@pytest.mark.parametrize(("service", "method"), METHODS, ids=METHOD_IDS)
def test_hostile_messages_long_run(fuzz_target, service, method):
    _fuzz_messages(fuzz_target, service, method, EXAMPLES * LONG_FACTOR)
    _fuzz_bytes(fuzz_target, service, method, EXAMPLES * LONG_FACTOR)
