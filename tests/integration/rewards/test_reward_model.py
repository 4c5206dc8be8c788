"""The reward-model scorer on tiny random classifiers saved to disk (no hub): scores, batching, head checks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    GPT2Config,
    GPT2ForSequenceClassification,
    LlamaConfig,
    LlamaForCausalLM,
    LlamaForSequenceClassification,
    PreTrainedTokenizerFast,
)

from marti.errors import InvalidArgumentError, NotFoundError
from marti.rewards import ModelRewardScorer

WORDS = ["[PAD]", "[UNK]", *"what is 2 + 4 = ? the answer capital of france paris lyon x y z".split()]
PROMPTS = ["what is 2 + 2 = ?", "the capital of france ?", "x"]
COMPLETIONS = [" 4", " the answer is paris", " y z"]


def save_tiny(folder, *, num_labels: int = 1, head: type = LlamaForSequenceClassification) -> str:
    """A 1-layer random ``head`` model (Llama: rotary positions; GPT-2: absolute ones, which padding on the
    wrong side shifts) and a whitespace word-level tokenizer, saved to ``folder``."""
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]").save_pretrained(
        folder
    )
    if head is GPT2ForSequenceClassification:
        config = GPT2Config(vocab_size=len(WORDS), n_embd=16, n_layer=1, n_head=2, num_labels=1)
    else:
        sizes = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
        config = LlamaConfig(vocab_size=len(WORDS), num_labels=num_labels, pad_token_id=0, **sizes)
    torch.manual_seed(0)
    head(config).save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def rm_path(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("rm"))


@pytest.fixture(scope="module")
def gpt2_path(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("gpt2"), head=GPT2ForSequenceClassification)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_scores_are_the_heads_output_and_do_not_depend_on_batching(request, arch):
    rm_path = request.getfixturevalue("rm_path" if arch == "llama" else "gpt2_path")
    one = ModelRewardScorer(rm_path, batch_size=1).score(PROMPTS, COMPLETIONS, {"label": ["4", "paris", "z"]})
    three = ModelRewardScorer(rm_path, batch_size=3)
    scores = three.score(PROMPTS, COMPLETIONS, {})
    assert len(scores) == 3 and all(isinstance(s, float) for s in scores) and len(set(scores)) == 3
    assert scores == pytest.approx(one, abs=1e-5)  # texts of 5, 8 and 3 words padded together
    with torch.no_grad():
        alone = three.model(**three.tokenizer([PROMPTS[1] + COMPLETIONS[1]], return_tensors="pt")).logits
    assert scores[1] == pytest.approx(float(alone[0, 0]), abs=1e-5)
    assert not three.model.training


def test_long_texts_keep_their_end(rm_path):
    rm = ModelRewardScorer(rm_path, max_length=3)
    short = rm.score(["x"], [" y z"], {})
    assert rm.score(["what is the capital of france ? x"], [" y z"], {}) == pytest.approx(short, abs=1e-5)


def test_wrong_head_is_refused_naming_path_and_num_labels(tmp_path):
    path = save_tiny(tmp_path / "three", num_labels=3)
    with pytest.raises(InvalidArgumentError) as err:
        ModelRewardScorer(path)
    assert path in str(err.value) and "num_labels=3" in str(err.value)


def test_causal_lm_is_not_a_reward_model(tmp_path):
    path = save_tiny(tmp_path / "lm", head=LlamaForCausalLM)
    with pytest.raises(InvalidArgumentError, match="not a sequence-classification model.*LlamaForCausalLM"):
        ModelRewardScorer(path)


def test_missing_folder_and_bad_arguments(tmp_path, rm_path):
    with pytest.raises(NotFoundError, match="is not a folder"):
        ModelRewardScorer(str(tmp_path / "nope"))
    with pytest.raises(NotFoundError, match="has no config.json"):
        ModelRewardScorer(str(tmp_path))
    with pytest.raises(InvalidArgumentError, match="batch_size"):
        ModelRewardScorer(rm_path, batch_size=0)
    with pytest.raises(InvalidArgumentError, match="device 'gpu0'"):
        ModelRewardScorer(rm_path, device="gpu0")
    (tmp_path / "config.json").write_text((Path(rm_path) / "config.json").read_text())
    with pytest.raises(NotFoundError, match="no tokenizer"):
        ModelRewardScorer(str(tmp_path))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_text((Path(rm_path) / name).read_text())
    with pytest.raises(NotFoundError, match="weights cannot be loaded"):
        ModelRewardScorer(str(tmp_path))
    rm = ModelRewardScorer(rm_path)
    with pytest.raises(InvalidArgumentError, match="prompts has 1 values for 2 completions"):
        rm.score(["x"], ["a", "b"], {})
    with pytest.raises(InvalidArgumentError, match="text 1 .* has no tokens"):
        rm.score(["x", ""], [" y", ""], {})


def test_the_check_before_a_job_refuses_a_folder_without_a_tokenizer_or_weights_without_reading_them(
    tmp_path, rm_path
):
    """``check_reward_model`` (marti train's check) read config.json only: a folder without a tokenizer or
    weights was found when the reward-model actor started, after the run folder, as a Ray actor's traceback."""
    from marti.rewards.model import check_reward_model

    (tmp_path / "config.json").write_text((Path(rm_path) / "config.json").read_text())
    with pytest.raises(NotFoundError, match=r"'.*': no tokenizer can be loaded from the folder"):
        check_reward_model(str(tmp_path))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_text((Path(rm_path) / name).read_text())
    with pytest.raises(NotFoundError, match=r"has no weights file \(model.safetensors, .*pytorch_model.bin"):
        check_reward_model(str(tmp_path))
    assert check_reward_model(rm_path).num_labels == 1
