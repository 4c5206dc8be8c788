"""Store SDK misuse (issue 29, item 14): wrong types, signs and ranges, and metadata JSON cannot carry, raise
InvalidArgumentError naming the argument or field, from the sync and the async client alike, over a real store.
None of them was a marti error before (raw TypeError, ValueError or AttributeError out of protobuf or json), and
a list as metadata was stored and then broke every later sample of its table."""

from __future__ import annotations

import re

import numpy as np
import pytest

from marti.api.experience.v1 import experience_pb2 as pb
from marti.api.experience.v1 import experience_service_pb2 as spb
from marti.api.experience.v1 import experience_service_pb2_grpc as sgrpc
from marti.clients.experience import AsyncExperienceSharingClient, ExperienceSharingClient
from marti.errors import InvalidArgumentError
from marti.rpc.client.channel import make_channel
from marti.types.trajectory import Trajectory, Turn


def _traj(**fields) -> Trajectory:
    return Trajectory(**{"episode_id": "e", "agent_id": "a", **fields})


def _turn(**fields) -> Trajectory:
    return _traj(turns=[Turn(**{"step": 0, **fields})])


_cycle: dict = {}
_cycle["self"] = _cycle
_deep: dict = {}
_level = _deep
for _ in range(1000):  # a raw RecursionError out of the SDK's JSON checks
    _level["x"] = _level = {}

#: (case id, method, args, kwargs, words the error must contain)
_SHARE = [
    ("episode_id", _traj(episode_id=5), "trajectory.episode_id"),
    ("session", _traj(session=5), "trajectory.session"),
    ("policy_version", _traj(policy_version="1"), "trajectory.policy_version"),
    ("created_at", _traj(created_at="x"), "trajectory.created_at"),
    ("episode_return", _traj(episode_return="x"), "trajectory.episode_return"),
    ("metadata-set", _traj(metadata={"a": {1, 2}}), "trajectory.metadata['a']"),
    ("metadata-list", _traj(metadata=[1]), "trajectory.metadata must be a dict"),
    ("metadata-key", _traj(metadata={(1,): 2}), "trajectory.metadata key (1,)"),
    ("metadata-cycle", _traj(metadata=_cycle), "trajectory.metadata['self']"),
    ("metadata-deep", _traj(metadata=_deep), "trajectory.metadata nests deeper than 254 levels"),
    ("info-deep", _turn(info={"a": [_deep]}), "trajectory.turns[0].info nests deeper than 254 levels"),
    # json.dumps wrote both keys as "1" and the store kept the last value: {"1": "b"}, with no error
    ("metadata-key-clash", _traj(metadata={1: "a", "1": "b"}), "trajectory.metadata has the keys 1 and '1'"),
    (
        "info-key-clash",
        _turn(info={"x": [{None: 0, "null": 1}]}),
        "trajectory.turns[0].info['x'][0] has the keys",
    ),
    ("info-bytes", _turn(info={"b": [b"x"]}), "trajectory.turns[0].info['b'][0]"),
    # json.dumps wrote NaN, which Python reads back but JSON parsers of other languages refuse
    (
        "metadata-nan",
        _traj(metadata={"x": [float("nan")]}),
        "trajectory.metadata['x'][0] value nan (JSON has no NaN",
    ),
    ("info-inf", _turn(info={"y": float("-inf")}), "trajectory.turns[0].info['y'] value -inf"),
    ("turn-type", _traj(turns=["x"]), "trajectory.turns[0] must be a Turn"),
    ("turns-type", _traj(turns=5), "trajectory.turns must be a list"),
    ("step-str", _turn(step="0"), "trajectory.turns[0].step"),
    ("step-huge", _turn(step=2**70), "trajectory.turns[0].step"),
    ("reward", _turn(reward="1"), "trajectory.turns[0].reward"),
    ("prompt_text", _turn(prompt_text=3), "trajectory.turns[0].prompt_text"),
    ("turn-policy_version", _turn(policy_version="1"), "trajectory.turns[0].policy_version"),
]
_CALLS = [
    ("batch_size-huge", "sample", ("q", 2**40), {"timeout_s": 0.1}, "batch_size"),
    ("min_policy_version-neg", "sample", ("q", 1), {"timeout_s": 0.1, "min_policy_version": -1}, "min_policy_version"),
    ("min_policy_version-huge", "sample", ("q", 1), {"min_policy_version": 2**63}, "min_policy_version"),
    ("current_policy_version-huge", "sample_batch", ("q", 1), {"current_policy_version": 2**64 - 1}, "current_policy_version"),
    ("get-policy_version-neg", "get_items", (), {"policy_version": -1}, "policy_version"),
    ("get-policy_version-huge", "get_trajectories", (), {"policy_version": 2**64 - 1}, "policy_version"),
]  # fmt: skip


async def _both(addr: str, method: str, args: tuple, kwargs: dict, words: str) -> None:
    """The call refused by both clients, with ``words`` in the message and nothing stored."""
    with ExperienceSharingClient("a", addr) as sync:
        sync.create_table("q", preset="queue")
        with pytest.raises(InvalidArgumentError) as err:
            getattr(sync, method)(*args, **kwargs)
        assert words in str(err.value)
        async with AsyncExperienceSharingClient("a", addr) as aio:
            with pytest.raises(InvalidArgumentError) as err:
                await getattr(aio, method)(*args, **kwargs)
            assert words in str(err.value)
        assert sync.info("q").size == 0


@pytest.mark.parametrize("trajectory, words", [c[1:] for c in _SHARE], ids=[c[0] for c in _SHARE])
async def test_a_bad_trajectory_field_is_named(store_server, trajectory, words):
    await _both(store_server[0], "share_experience", (trajectory,), {"table": "q"}, words)


@pytest.mark.parametrize("method, args, kwargs, words", [c[1:] for c in _CALLS], ids=[c[0] for c in _CALLS])
async def test_an_argument_out_of_its_range_is_named(store_server, method, args, kwargs, words):
    await _both(store_server[0], method, args, kwargs, words)


@pytest.mark.parametrize(
    "kwargs, words",
    [({"agent_id": 5}, "agent_id"), ({"agent_id": ""}, "agent_id"), ({"chunk_bytes": "x"}, "chunk_bytes")],
)
def test_bad_constructor_arguments_are_named(store_server, kwargs, words):
    for cls in (ExperienceSharingClient, AsyncExperienceSharingClient):
        with pytest.raises(InvalidArgumentError, match=words):
            cls(**{"agent_id": "a", "address": store_server[0], **kwargs})


def test_the_store_refuses_metadata_that_is_not_a_json_object(store_server):
    """A protocol client (not the SDK) cannot store an item whose metadata no sampler could read back."""
    addr, _ = store_server
    with ExperienceSharingClient("a", addr) as store:
        store.create_table("q", preset="queue")
        deep = '{"a": ' + "[" * 5000 + "]" * 5000 + "}"  # was INTERNAL for the whole stream (RecursionError)
        bad = [
            pb.Trajectory(episode_id="e", agent_id="a", metadata_json="[1]"),
            pb.Trajectory(episode_id="e", agent_id="a", turns=[pb.Turn(step=0, info_json="{")]),
            pb.Trajectory(episode_id="e", agent_id="a", metadata_json=deep),
            pb.Trajectory(episode_id="e", agent_id="a", metadata_json='{"a": ' + "[" * 255 + "]" * 255 + "}"),
        ]
        channel = make_channel(addr)
        stub = sgrpc.ExperienceServiceStub(channel)
        items = [pb.InsertItem(table="q", trajectory=t, client_seq=i) for i, t in enumerate(bad)]
        (resp,) = stub.Insert(iter([spb.InsertRequest(items=items)]))
        channel.close()
        codes_and_messages = [(c.status.code, c.status.message) for c in resp.confirmations]
        assert [code for code, _ in codes_and_messages] == [3, 3, 3, 3]  # INVALID_ARGUMENT
        assert "trajectory.metadata_json" in codes_and_messages[0][1]
        assert "trajectory.turns[0].info_json" in codes_and_messages[1][1]
        assert "trajectory.metadata_json nests deeper than 254 levels" in codes_and_messages[2][1]
        assert "trajectory.metadata_json nests deeper than 254 levels" in codes_and_messages[3][1]
        assert store.info("q").size == 0


_OVER_64_BITS = 2**70
_CONFIGS = [
    ({"max_size": _OVER_64_BITS}, "max_size"),
    ({"max_bytes": _OVER_64_BITS}, "max_bytes"),
    ({"max_times_sampled": _OVER_64_BITS}, "max_times_sampled"),
    ({"max_policy_lag": _OVER_64_BITS}, "max_policy_lag"),
    ({"rate_limiter": {"kind": "queue", "size": _OVER_64_BITS}}, "rate_limiter.size"),
    ({"signature": {"max_turns": _OVER_64_BITS}}, "signature.max_turns"),
    ({"signature": {"min_policy_version": -_OVER_64_BITS}}, "signature.min_policy_version"),
]


@pytest.mark.parametrize("fields, words", _CONFIGS, ids=[c[1] for c in _CONFIGS])
async def test_a_table_config_number_over_64_bits_is_named(store_server, fields, words):
    """A table setting the protocol's int64 cannot carry: ``create_table`` raised protobuf's bare ValueError
    ("Value out of range"), and the same setting in a ``--config`` file made a table that every ListTables and
    GetTableInfo then failed on with INTERNAL. Now both clients refuse it naming the field, and no table is
    made."""
    addr, _ = store_server
    with ExperienceSharingClient("a", addr) as sync:
        with pytest.raises(
            InvalidArgumentError, match=rf"bad config for table 't': {words}: .*922337203685477580[78]"
        ):
            sync.create_table("t", **fields)
        async with AsyncExperienceSharingClient("a", addr) as aio:
            with pytest.raises(InvalidArgumentError, match=words):
                await aio.create_table("t", **fields)
        assert "t" not in [t.name for t in sync.list_tables()]


_CONVERTED = [
    ({"max_size": "10"}, "max_size: Value error, must be an integer, not str"),
    ({"max_size": 10.0}, "max_size: Value error, must be an integer, not float"),
    (
        {"preset": "queue", "max_times_sampled": True},
        "max_times_sampled: Value error, must be an integer, not bool",
    ),
    (
        {"sampler": "prioritized", "priority_exponent": "0.6"},
        "priority_exponent: Value error, must be a number",
    ),
    (
        {"rate_limiter": {"kind": "min_size", "min_size_to_sample": "5"}},
        "rate_limiter.min_size_to_sample: Value",
    ),
    (
        {"signature": {"require_logprobs": "yes"}},
        "signature.require_logprobs: Input should be a valid boolean",
    ),
]


@pytest.mark.parametrize("fields, words", _CONVERTED, ids=[c[1].split(":")[0] for c in _CONVERTED])
def test_a_table_setting_of_the_wrong_type_is_named_not_converted(store_server, fields, words):
    """``create_table("t", max_size="10")`` made a table of 10 items, ``max_times_sampled=True`` one of 1 and
    ``require_logprobs="yes"`` one that required them: pydantic converted what it could. Now each is refused naming
    the field, and no table is made; numpy numbers still count (``max_size=np.int64(5)``)."""
    with ExperienceSharingClient("a", store_server[0]) as client:
        with pytest.raises(InvalidArgumentError, match=rf"bad config for table 't': {re.escape(words)}"):
            client.create_table("t", **fields)
        assert "t" not in [t.name for t in client.list_tables()]
        assert (
            client.create_table("n", max_size=np.int64(5), priority_exponent=np.float32(0.5)).config.max_size
            == 5
        )
