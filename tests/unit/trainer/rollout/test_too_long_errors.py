"""A too-long prompt's error (:func:`~services.trainer.rollout.engines.base.check_room`) carries its numbers in
``metadata``, so the caller reads the prompt's position from them, also after the error crossed a Ray actor
(pickled, re-raised as Ray's dual ``RayTaskError``/``InvalidArgumentError`` whose message holds the actor's
traceback), and :func:`shifted` rebuilds it for the whole call without that traceback."""

from __future__ import annotations

import pickle

import pytest
from ray.exceptions import RayTaskError

from marti.errors import InvalidArgumentError
from services.trainer.rollout.engines.base import TOO_LONG_KEYS, check_room, shifted, too_long_prompt


def _refused(ids: list[list[int]], max_new_tokens: int, max_model_len: int) -> InvalidArgumentError:
    with pytest.raises(InvalidArgumentError) as info:
        check_room(ids, max_new_tokens, max_model_len)
    return info.value


def test_the_error_names_the_first_prompt_that_does_not_fit_and_carries_its_numbers() -> None:
    err = _refused([[1] * 5, [1] * 9, [1] * 20], max_new_tokens=4, max_model_len=12)
    assert str(err) == "prompt 1: 9 tokens + max_new_tokens 4 exceeds max_model_len 12"
    assert dict(err.metadata) == dict(zip(TOO_LONG_KEYS, ("1", "9", "4", "12"), strict=True))
    assert too_long_prompt(err) == 1
    check_room([[1] * 8], max_new_tokens=4, max_model_len=12)  # exactly full: fits


def test_a_ray_actors_error_is_read_from_its_metadata_and_shifted_to_the_whole_call() -> None:
    err = pickle.loads(pickle.dumps(_refused([[1] * 3, [1] * 30], max_new_tokens=8, max_model_len=32)))
    dual = RayTaskError("generate", "Traceback (most recent call last):\n  ...prompt 9: 1 tokens", err)
    dual = dual.as_instanceof_cause()
    assert isinstance(dual, InvalidArgumentError) and "prompt 9" in str(dual)  # a decoy in the traceback
    assert too_long_prompt(dual) == 1  # the metadata's, not a number found in the traceback text
    whole = shifted(dual, 6)
    assert type(whole) is InvalidArgumentError and too_long_prompt(whole) == 7
    assert str(whole) == "prompt 7: 30 tokens + max_new_tokens 8 exceeds max_model_len 32"


@pytest.mark.parametrize(
    "other",
    [
        InvalidArgumentError("prompt 3: 9 tokens + max_new_tokens 4 exceeds max_model_len 12"),  # text alone
        InvalidArgumentError("bad", metadata={"prompt_index": "1"}),  # some of the keys
        ValueError("prompt 3"),
    ],
)
def test_any_other_error_is_not_a_too_long_prompt(other: Exception) -> None:
    assert too_long_prompt(other) is None and shifted(other, 4) is other
