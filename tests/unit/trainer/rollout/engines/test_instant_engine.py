"""The model-free engine ``marti bench gateway`` measures the gateway with: deterministic answers, stop strings cut
as the transformers engine cuts them, and its limits named."""

from __future__ import annotations

import pytest

from marti.errors import FailedPreconditionError, InvalidArgumentError, NotFoundError
from services.trainer.models.loading import load_tokenizer
from services.trainer.rollout.engines.base import SamplingParams
from services.trainer.rollout.engines.hf import trim_at_stop
from services.trainer.rollout.engines.instant import InstantRolloutEngine


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def test_the_same_prompt_gets_the_same_answer_of_max_new_tokens(tok):
    engine = InstantRolloutEngine({"a": tok}, max_model_len=64)
    chat = [{"role": "user", "content": "hi"}]
    first, again, text = engine.generate("a", [chat, chat, "other words"], SamplingParams(max_new_tokens=6))
    assert first.response_token_ids == again.response_token_ids and len(first.response_token_ids) == 6
    assert first.finish_reason == "length" and first.response_logprobs == [0.0] * 6
    assert first.text == tok.decode(first.response_token_ids, skip_special_tokens=True) and first.text.strip()
    assert text.prompt_token_ids == tok("other words", add_special_tokens=False)["input_ids"]


def test_a_stop_string_ends_the_answer_as_the_hf_engine_cuts_it(tok):
    engine = InstantRolloutEngine({"a": tok})
    whole = engine.generate("a", [[5, 6, 7]], SamplingParams(max_new_tokens=12))[0]
    stop = whole.text.split()[2]
    cut = engine.generate("a", [[5, 6, 7]], SamplingParams(max_new_tokens=12, stop=[stop]))[0]
    end, reason, text = trim_at_stop(tok, whole.response_token_ids, False, SamplingParams(stop=[stop]))
    assert (len(cut.response_token_ids), cut.finish_reason, cut.text) == (end, reason, text)
    assert cut.finish_reason == "stop" and stop not in cut.text


def test_limits_and_versions_are_checked(tok):
    engine = InstantRolloutEngine({"a": tok}, max_model_len=8)
    with pytest.raises(InvalidArgumentError, match="max_model_len 8"):
        engine.generate("a", [[1, 2, 3]], SamplingParams(max_new_tokens=6))
    with pytest.raises(NotFoundError, match="'b'"):
        engine.generate("b", [[1]], SamplingParams(max_new_tokens=1))
    engine.update_weights("a", {}, 3)
    assert engine.generate("a", [[1]], SamplingParams(max_new_tokens=1))[0].policy_version == 3
    with pytest.raises(FailedPreconditionError):
        engine.update_weights("a", {}, 2)
    with pytest.raises(InvalidArgumentError, match="no weights"):
        engine.update_weights("a", {"w": object()}, 4)  # type: ignore[dict-item]
    with pytest.raises(InvalidArgumentError, match="max_model_len"):
        InstantRolloutEngine({"a": tok}, max_model_len=0)
