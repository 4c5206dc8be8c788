"""Proto <-> domain conversion: packed and repeated token fields, validation naming fields, table configs."""

from __future__ import annotations

import math

import pytest

from marti.api.experience.v1 import experience_pb2 as pb
from marti.codec import experience as convert
from marti.errors import InvalidArgumentError
from marti.types.experience import parse_table_config
from marti.types.trajectory import Trajectory, Turn


def sample_traj() -> Trajectory:
    return Trajectory(
        "ep", "a1", session="s", role="planner", policy_version=3, metadata={"m": 1}, created_at=12.5,
        turns=[Turn(0, [1, 2], [3, 4, 5], [-0.5, -0.25, -1.0], 1.5, info={"x": [1]}, prompt_text="p"),
               Turn(1, [], [7], [], None, terminated=True)],
    )  # fmt: skip


@pytest.mark.parametrize("packed", [True, False])
def test_roundtrip_packed_and_repeated(packed):
    t = sample_traj()
    msg = convert.trajectory_to_proto(t, packed=packed)
    assert bool(msg.turns[0].response_token_ids_i32le) == packed
    back = convert.trajectory_from_proto(pb.Trajectory.FromString(msg.SerializeToString()))
    assert back == t
    s = convert.summarize_proto(msg)
    assert (s.prompt_lengths, s.response_lengths, s.logprob_lengths, s.rewards_present) == (
        (2, 0), (3, 1), (3, 0), (True, False),
    )  # fmt: skip


def test_validation_names_fields():
    msg = convert.trajectory_to_proto(sample_traj())
    msg.turns[0].response_logprobs_f32le = msg.turns[0].response_logprobs_f32le[:-4]
    with pytest.raises(InvalidArgumentError, match=r"turns\[0\].response_logprobs has 2 values"):
        convert.summarize_proto(msg)
    msg = convert.trajectory_to_proto(sample_traj())
    msg.turns[0].response_token_ids_i32le += b"\x00"
    with pytest.raises(InvalidArgumentError, match="response_token_ids_i32le has 13 bytes"):
        convert.summarize_proto(msg)
    msg = convert.trajectory_to_proto(sample_traj(), packed=False)
    msg.turns[0].response_logprobs[1] = math.nan
    with pytest.raises(InvalidArgumentError, match="non-finite"):
        convert.summarize_proto(msg)
    msg = convert.trajectory_to_proto(sample_traj())
    msg.agent_id = ""
    with pytest.raises(InvalidArgumentError, match="agent_id"):
        convert.summarize_proto(msg)
    msg = convert.trajectory_to_proto(sample_traj())
    msg.turns[1].step = 0
    msg.turns[0].step = 5
    with pytest.raises(InvalidArgumentError, match=r"turns\[1\].step"):
        convert.summarize_proto(msg)
    with pytest.raises(InvalidArgumentError, match="info_json"):
        convert.trajectory_from_proto(
            pb.Trajectory(episode_id="e", agent_id="a", turns=[pb.Turn(info_json="[1]")])
        )
    t = sample_traj()
    t.turns[0].prompt_token_ids = [2**40]
    with pytest.raises(InvalidArgumentError, match="int32"):
        convert.trajectory_to_proto(t)


def test_encoded_roundtrip_and_limits():
    msg = convert.trajectory_to_proto(sample_traj())
    enc = convert.encode_proto(msg, chunk_bytes=16)
    assert len(enc.chunks) > 3
    assert convert.decode_encoded(enc, 10_000) == msg
    with pytest.raises(InvalidArgumentError, match="max_item_bytes=10"):
        convert.decode_encoded(enc, 10)
    with pytest.raises(InvalidArgumentError, match="zstd"):
        convert.decode_encoded(pb.EncodedTrajectory(chunks=[b"garbage"]), 10_000)


@pytest.mark.parametrize("form", ["typed", "encoded"])
def test_an_insert_item_over_the_limit_is_refused_in_either_form(form):
    """A typed InsertItem is checked against ``max_bytes`` by the check a decompressed one gets."""
    msg = convert.trajectory_to_proto(sample_traj())
    size = msg.ByteSize()
    item = (
        pb.InsertItem(trajectory=msg)
        if form == "typed"
        else pb.InsertItem(encoded=convert.encode_proto(msg, chunk_bytes=1 << 16))
    )
    assert convert.item_payload(item, size, 1 << 16)[1].episode_id == msg.episode_id
    with pytest.raises(InvalidArgumentError, match=rf"^payload .*\b{size}\b.* L={size - 1}$"):
        convert.item_payload(item, size - 1, 1 << 16, "L")


@pytest.mark.parametrize(
    "cfg",
    [
        {"name": "q", "preset": "queue", "max_size": 7},
        {"name": "p", "sampler": "prioritized", "priority_exponent": 0.6, "importance_beta": 0.4, "remover": "min_heap",
         "max_bytes": 1000, "signature": {"roles": ["r"], "max_turns": 3, "require_logprobs": True}},
        {"name": "r", "rate_limiter": {"kind": "sample_to_insert_ratio", "samples_per_insert": 2,
                                       "min_size_to_sample": 5, "error_buffer": 4}},
        {"name": "c", "rate_limiter": {"kind": "custom", "min_diff": -3, "max_diff": 10}},
    ],
)  # fmt: skip
def test_table_config_roundtrip(cfg):
    c = parse_table_config(cfg)
    assert convert.table_config_from_proto(convert.table_config_to_proto(c)) == c


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("name", ["prompt_token_ids", "response_token_ids"])
def test_a_negative_token_id_is_refused_naming_the_turn_and_field(packed, name):
    """What the store checks on every insert over gRPC (packed or repeated fields): a vocabulary index is >= 0."""
    turn = Turn(step=0, prompt_token_ids=[1, 2], response_token_ids=[3, 4])
    setattr(turn, name, [7, -5])
    msg = convert.trajectory_to_proto(Trajectory("e", "a", turns=[Turn(step=0), turn]), packed=packed)
    with pytest.raises(InvalidArgumentError, match=rf"turns\[1\]\.{name} holds the negative token id -5"):
        convert.summarize_proto(msg)


@pytest.mark.parametrize(
    ("packed", "ids", "shown"),
    [
        *((packed, ids, shown) for packed in (True, False) for ids, shown in (
            ([4, None], "None"), ([1.5], "1.5"), (["7"], "'7'"), ([2**31], str(2**31)),
        )),
        (False, [True, False], "True"),
    ],
)  # fmt: skip
def test_a_token_id_that_is_not_an_int32_is_refused_naming_it(packed, ids, shown):
    """Packed or not, the encoder names the field and the first bad id (protobuf's own TypeError, which names no
    field, does not escape the repeated fields, which also refuse a bool; packed, a bool is Python's int)."""
    turn = Turn(step=0, prompt_token_ids=[1], response_token_ids=ids)
    match = rf"turns\[0\]\.response_token_ids holds {shown}, not an integer in int32"
    with pytest.raises(InvalidArgumentError, match=match):
        convert.trajectory_to_proto(Trajectory("e", "a", turns=[turn]), packed=packed)


def test_a_bool_token_id_packs_as_pythons_int():
    """Packed, ``True`` is 1 (no per-id type check: it would double the cost of packing; ``_pack_ids``)."""
    turn = Turn(step=0, prompt_token_ids=[True, False, 7], response_token_ids=[1])
    back = convert.trajectory_from_proto(convert.trajectory_to_proto(Trajectory("e", "a", turns=[turn])))
    assert back.turns[0].prompt_token_ids == [1, 0, 7]
