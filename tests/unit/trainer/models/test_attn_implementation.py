"""``policy.attn_implementation`` reaches model loading (transformers' ``attn_implementation=``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from marti.config import load_config
from marti.errors import InvalidArgumentError
from services.trainer.learn.critic import build_critic
from services.trainer.models.loading import load_model
from services.trainer.models.policy import MultiAgentPolicy
from services.trainer.models.resolve import check_attn_implementation
from services.trainer.ray.policy_worker import policy_layout

ROOT = Path(__file__).resolve().parents[4]
NO_FLASH = importlib.util.find_spec("flash_attn") is None


@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
def test_load_model_uses_the_named_kernel(kernel):
    model = load_model("tiny-llama", attn_implementation=kernel)
    assert model.config._attn_implementation == kernel


@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
def test_the_config_key_reaches_every_policy_model_and_the_critic(kernel):
    cfg = load_config(
        ROOT / "examples" / "tiny.yaml",
        [f"policy.attn_implementation={kernel}", "policy.mode=per_agent"],
        ("policy.lora_r", "policy.lora_alpha"),  # tiny.yaml's LoRA keys: no adapters in per_agent mode
    )
    policy = MultiAgentPolicy(policy_layout(cfg))
    for agent in policy.agent_ids:
        assert policy.model(agent).config._attn_implementation == kernel
    critic = build_critic("tiny-llama", attn_implementation=kernel)
    assert critic.backbone.config._attn_implementation == kernel


def test_eager_and_sdpa_give_the_same_logits():
    import torch

    ids = torch.tensor([[1, 2, 3, 4, 5]])
    eager = load_model("tiny-llama", attn_implementation="eager")(ids).logits
    sdpa = load_model("tiny-llama", attn_implementation="sdpa")(ids).logits
    assert torch.allclose(eager, sdpa, atol=1e-5)


@pytest.mark.skipif(not NO_FLASH, reason="flash_attn is installed here")
def test_flash_attention_without_the_package_is_refused_naming_the_value():
    with pytest.raises(InvalidArgumentError, match="flash_attention_2.*flash_attn"):
        check_attn_implementation("flash_attention_2")
    with pytest.raises(InvalidArgumentError, match="flash_attention_2"):
        load_model("tiny-llama", attn_implementation="flash_attention_2")


def test_an_unknown_kernel_is_refused():
    with pytest.raises(InvalidArgumentError, match="'paged'"):
        check_attn_implementation("paged")
