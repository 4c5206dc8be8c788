"""The env protocol codec: values and spaces survive a proto round trip exactly."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import data_equivalence

from marti.api.env.v1 import env_pb2 as pb
from marti.codec import env as c
from marti.errors import InvalidArgumentError
from services.env_server.envs.text_base import text_space


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        0,
        -(2**62),
        1.5,
        "tëxt",
        [1, "a", None],
        {"a": {"b": [1.0, False]}},
        np.arange(6, dtype=np.int8).reshape(2, 3),
        np.array(3.5, dtype=np.float32),
        np.zeros((0, 2), np.float64),
        {"observation": np.ones((3, 3, 2), np.int8), "action_mask": np.array([1, 0], np.int8)},
    ],
)
def test_value_round_trip(value) -> None:
    back = c.value_from_proto(pb.Value.FromString(c.value_to_proto(value).SerializeToString()))
    assert data_equivalence(value if not isinstance(value, tuple) else list(value), back)


def test_numpy_scalars_become_python_numbers() -> None:
    assert c.value_from_proto(c.value_to_proto(np.int64(3))) == 3
    assert type(c.value_from_proto(c.value_to_proto(np.float32(0.5)))) is float
    assert c.value_from_proto(c.value_to_proto((1, 2))) == [1, 2]


def test_bad_values_are_rejected() -> None:
    with pytest.raises(InvalidArgumentError, match="type object"):
        c.value_to_proto(object())
    with pytest.raises(InvalidArgumentError, match="keys must be strings"):
        c.value_to_proto({1: 2})
    with pytest.raises(InvalidArgumentError, match="needs 8 bytes"):
        c.tensor_from_proto(pb.Tensor(dtype="int32", shape=[2], data=b"\x00" * 7))
    with pytest.raises(InvalidArgumentError, match="dtype"):
        c.tensor_from_proto(pb.Tensor(dtype="nonsense", shape=[1], data=b"\x00"))
    deep = pb.Value(int_value=1)
    for _ in range(c.MAX_VALUE_DEPTH + 2):
        deep = pb.Value(list=pb.ValueList(values=[deep]))
    with pytest.raises(InvalidArgumentError, match="MAX_VALUE_DEPTH"):
        c.value_from_proto(deep)


@pytest.mark.parametrize(
    "space",
    [
        text_space(100),
        gymnasium.spaces.Discrete(9, start=1),
        gymnasium.spaces.Box(low=-1.0, high=2.0, shape=(3, 2), dtype=np.float32),
        gymnasium.spaces.MultiBinary([2, 3]),
        gymnasium.spaces.MultiDiscrete([3, 4]),
        gymnasium.spaces.Dict(
            {
                "observation": gymnasium.spaces.Box(0, 1, (3, 3, 2), np.int8),
                "action_mask": gymnasium.spaces.Box(0, 1, (9,), np.int8),
            }
        ),
        gymnasium.spaces.Tuple([gymnasium.spaces.Discrete(2), text_space(5)]),
    ],
)
def test_space_round_trip(space) -> None:
    back = c.space_from_proto(pb.Space.FromString(c.space_to_proto(space).SerializeToString()))
    assert back == space
    sample = space.sample()
    assert back.contains(sample)


def test_infos_take_the_json_path_exactly() -> None:
    import json

    infos = {
        "a1": {"a": 1, "b": 1.0, "c": True, "d": None, "e": "x", "f": [1, 2.5, "y", False], "g": {"h": [1]}}
    }
    back = json.loads(c.infos_json(infos))
    assert back == infos
    assert all(type(back["a1"][k]) is type(v) for k, v in infos["a1"].items())
    assert c.infos_json({"a1": {"m": np.array([1])}}) is None
    assert c.infos_json({"a1": {"m": np.int64(1)}}) is None
    assert c.infos_json({"a1": {1: "int key"}}) is None
