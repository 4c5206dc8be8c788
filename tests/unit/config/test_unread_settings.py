"""Settings the rest of the config leaves unread are refused at config load, naming the keys and values and the
key that leaves them unread (``marti/config/unread.py``, docs/config.md "Rules"); so is a frozen agent whose
weights another agent's update would change (``policy.mode: shared``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from marti.config import config_from_dict, load_config
from marti.errors import InvalidArgumentError

TINY = Path(__file__).resolve().parents[3] / "examples" / "tiny.yaml"
GRPO = "algorithm.advantage_estimator=grpo"
GAE = "algorithm.advantage_estimator=gae"
FROZEN = "agents.1.is_tuning=false"
#: tiny.yaml's LoRA keys (lora_r 4, lora_alpha 8), unset where a test runs it outside policy.mode lora.
NOT_LORA = ("policy.lora_r", "policy.lora_alpha")


@pytest.mark.parametrize(
    ("overrides", "needles"),
    [
        ([GRPO, "algorithm.lambd=0.5"], ["algorithm.lambd=0.5 (default 0.95)", "it is grpo"]),
        (
            ["algorithm.advantage_estimator=rloo", "algorithm.value_clip=0.5"],
            ["algorithm.value_clip=0.5", "rloo"],
        ),
        ([GRPO, "algorithm.value_clip=null"], ["algorithm.value_clip=None (default 0.2)"]),
        (
            ["algorithm.advantage_estimator=reinforce++", "algorithm.critic_learning_rate=1e-5"],
            ["critic_learning_rate"],
        ),
        (
            [GRPO, "agents.1.critic_model=tiny-llama"],
            ["agents.1.critic_model=tiny-llama", "advantage_estimator=gae"],
        ),
        ([GRPO, "strategy.name=deepspeed", "strategy.critic_zero_stage=2"], ["strategy.critic_zero_stage=2"]),
        (
            ["algorithm.kl_coef=0", "agents.0.ref_model=tiny-llama"],
            ["agents.0.ref_model=tiny-llama", "kl_coef=0"],
        ),
        (
            ["algorithm.kl_coef=0", "strategy.offload_reference_model=true"],
            ["strategy.offload_reference_model"],
        ),
        ([FROZEN, "agents.1.learning_rate=0.1"], ["agents.1.learning_rate=0.1", "is_tuning=false"]),
        ([FROZEN, "agents.1.ref_model=tiny-llama"], ["agents.1.ref_model=tiny-llama"]),
        (
            [GAE, FROZEN, "agents.1.critic_model=tiny-llama"],
            ["agents.1.critic_model=tiny-llama", "is_tuning"],
        ),
    ],
)
def test_an_unread_setting_is_refused_naming_it_and_what_leaves_it_unread(overrides, needles):
    with pytest.raises(InvalidArgumentError) as err:
        load_config(TINY, overrides)
    assert all(n in str(err.value) for n in needles), str(err.value)


def test_critic_settings_name_every_key_in_one_message():
    with pytest.raises(InvalidArgumentError) as err:
        load_config(TINY, [GRPO, "algorithm.lambd=0.5", "algorithm.critic_learning_rate=1e-5"])
    assert "algorithm.lambd=0.5 (default 0.95), algorithm.critic_learning_rate=1e-05 (default None)" in str(
        err.value
    )


@pytest.mark.parametrize(
    "overrides",
    [
        [GAE, "algorithm.lambd=0.5", "algorithm.value_clip=0.5", "algorithm.critic_learning_rate=1e-5"],
        [GAE, "agents.1.critic_model=tiny-llama", "strategy.name=deepspeed", "strategy.critic_zero_stage=2"],
        [GRPO, "algorithm.lambd=0.95", "algorithm.value_clip=0.2"],  # the defaults, written out
        ["algorithm.kl_coef=0.01", "agents.0.ref_model=tiny-llama", "strategy.offload_reference_model=true"],
        [FROZEN, "agents.0.learning_rate=0.1", "agents.0.ref_model=tiny-llama"],  # the trained agent's
    ],
)
def test_the_same_settings_load_where_they_are_read(overrides):
    load_config(TINY, overrides)


def test_a_saved_config_with_every_default_written_loads_again():
    cfg = load_config(TINY, [FROZEN])
    assert config_from_dict(cfg.model_dump(mode="json")) == cfg


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (
            [GRPO, "algorithm.normalize_advantages=false"],
            "algorithm.normalize_advantages=False (default True)",
        ),
        ([GAE, "algorithm.group_by=agent_turn"], "algorithm.group_by=agent_turn (default problem)"),
        (["algorithm.advantage_estimator=reinforce++", "algorithm.group_by=agent_turn"], "is reinforce++"),
        (
            ["algorithm.advantage_estimator=reinforce++_baseline", "algorithm.normalize_per_agent=true"],
            "per_agent",
        ),
        ([GAE, "algorithm.normalize_per_agent=true"], "algorithm.normalize_per_agent=True"),
        (["algorithm.loss_norm_tokens=4"], "algorithm.loss_agg_mode is token-mean"),
        (["algorithm.advantage_estimator=rloo", "algorithm.gamma=0.9"], "algorithm.gamma=0.9 (default 1.0)"),
        (
            ["policy.ema_beta=0.5"],
            "policy.ema_beta=0.5 (default 0.992) is the decay of policy.ema, which is false",
        ),
    ],
)
def test_an_option_the_estimator_loss_or_ema_does_not_read_is_refused(overrides, needle):
    with pytest.raises(InvalidArgumentError, match=r"^.*tiny\.yaml: ") as err:
        load_config(TINY, overrides)
    assert needle in str(err.value), str(err.value)


@pytest.mark.parametrize(
    "overrides",
    [
        [GAE, "algorithm.normalize_advantages=false"],
        ["algorithm.advantage_estimator=reinforce++_baseline", "algorithm.group_by=agent_turn"],
        ["algorithm.advantage_estimator=dr_grpo", "algorithm.normalize_per_agent=true"],
        ["algorithm.loss_agg_mode=seq-mean-token-sum-norm", "algorithm.loss_norm_tokens=4"],
        ["policy.ema=true", "policy.ema_beta=0.5"],
        ["algorithm.turn_rewards=dense", "algorithm.gamma=0.9"],  # grpo's per-turn returns
        ["algorithm.advantage_estimator=reinforce++_baseline", "algorithm.gamma=0.9"],
    ],
)
def test_the_same_options_load_with_their_reader(overrides):
    load_config(TINY, overrides)


def test_a_frozen_agent_on_the_shared_model_is_refused():
    """``shared`` mode updates the one model every agent acts with: a frozen agent there would change anyway."""
    with pytest.raises(InvalidArgumentError, match=r"policy.mode=shared .* frozen agents \['agent_2'\]"):
        load_config(TINY, ["policy.mode=shared", FROZEN], NOT_LORA)
    load_config(TINY, ["policy.mode=shared"], NOT_LORA)
    assert load_config(TINY, ["policy.mode=lora", FROZEN]).tuning_agents == ["agent_1"]
    assert load_config(TINY, ["policy.mode=per_agent", FROZEN], NOT_LORA).tuning_agents == ["agent_1"]


PER_AGENT = "policy.mode=per_agent"
BF16 = "rollout.dtype=bfloat16"


@pytest.mark.parametrize(
    ("overrides", "unset", "needles"),
    [
        (  # tiny.yaml's lora_r 4 and lora_alpha 8 under --set policy.mode=per_agent
            [PER_AGENT],
            (),
            [
                "policy.lora_r=4 (default 8), policy.lora_alpha=8.0 (default 16.0) configure the LoRA adapters",
                "policy.mode is per_agent, which trains no adapters",
                "--unset policy.lora_r --unset policy.lora_alpha",
                "or set policy.mode lora",
            ],
        ),
        (["policy.mode=shared"], ("policy.lora_alpha",), ["policy.lora_r=4", "policy.mode is shared"]),
        (
            ["policy.mode=auto", "agents.1.pretrain_model=other", "policy.lora_dropout=0.1"],
            NOT_LORA,
            ["policy.lora_dropout=0.1 (default 0.0)", "policy.mode is auto (here per_agent)"],
        ),
        (
            [PER_AGENT, "policy.lora_target_modules=[q_proj]"],
            NOT_LORA,
            ["policy.lora_target_modules=['q_proj']"],
        ),
        (
            ["algorithm.kl_coef=0", "algorithm.kl_estimator=k1", "algorithm.use_kl_loss=false"],
            (),
            [
                "algorithm.kl_estimator=k1 (default k3), algorithm.use_kl_loss=False (default True) configure the KL",
                "algorithm.kl_coef=0 turns off",
                "--unset algorithm.kl_estimator --unset algorithm.use_kl_loss",
                "or set kl_coef > 0",
            ],
        ),
        (
            ["algorithm.advantage_estimator=dr_grpo", "algorithm.adv_eps=0.01"],
            (),
            [
                "algorithm.adv_eps=0.01 (default 1e-06) is added to the std",
                "algorithm.advantage_estimator is dr_grpo with normalize_per_agent False",
                "--unset algorithm.adv_eps",
            ],
        ),
        (["algorithm.advantage_estimator=rloo", "algorithm.adv_eps=0.01"], (), ["is rloo with"]),
        (
            ["algorithm.advantage_estimator=reinforce++", "algorithm.adv_eps=0.01"],
            (),
            ["algorithm.adv_eps=0.01"],
        ),
        ([GAE, "algorithm.adv_eps=0.01"], (), ["algorithm.adv_eps=0.01", "is gae"]),
        (
            ["rollout.merge_adapters=2"],
            (),
            [
                "rollout.merge_adapters=2 (default 1) is how many LoRA adapters",
                "rollout.dtype is null",
                "--unset rollout.merge_adapters",
            ],
        ),
        ([PER_AGENT, BF16, "rollout.merge_adapters=0"], NOT_LORA, ["policy.mode is per_agent"]),
        (
            ["device=cuda", "rollout.engine=vllm", "rollout.dtype=auto", "rollout.merge_adapters=0"],
            (),
            ["rollout.engine is vllm, which merges nothing"],
        ),
    ],
)
def test_a_key_its_section_leaves_unread_is_refused_with_the_unset_fix(overrides, unset, needles):
    """The LoRA keys outside lora mode, the KL's keys without the KL, ``adv_eps`` where no std is divided by and
    ``merge_adapters`` where no engine merges: the message names the key, its value, what leaves it unread and
    the ``--unset`` that fixes it."""
    with pytest.raises(InvalidArgumentError, match=r"^.*tiny\.yaml: ") as err:
        load_config(TINY, overrides, unset)
    assert all(n in str(err.value) for n in needles), str(err.value)


@pytest.mark.parametrize(
    ("overrides", "unset"),
    [
        ([PER_AGENT], NOT_LORA),  # the fix the refusal names
        (["policy.mode=auto", "policy.lora_dropout=0.1"], ()),  # auto with one base model is lora
        (["policy.mode=shared", "policy.lora_r=8", "policy.lora_alpha=16"], ()),  # the defaults, written out
        (["algorithm.kl_coef=0.01", "algorithm.kl_estimator=k1", "algorithm.use_kl_loss=false"], ()),
        (["algorithm.kl_coef=0", "algorithm.kl_estimator=k3", "algorithm.use_kl_loss=true"], ()),
        (["algorithm.adv_eps=0.01"], ()),  # grpo divides by the group std
        (
            [
                "algorithm.advantage_estimator=dr_grpo",
                "algorithm.normalize_per_agent=true",
                "algorithm.adv_eps=0.01",
            ],
            (),
        ),
        (
            [
                "algorithm.advantage_estimator=rloo",
                "algorithm.normalize_per_agent=true",
                "algorithm.adv_eps=0.01",
            ],
            (),
        ),
        ([BF16, "rollout.merge_adapters=2"], ()),
        (["rollout.engine=hf_static", "rollout.dtype=auto", "rollout.merge_adapters=0"], ()),
    ],
)
def test_the_same_keys_load_where_they_are_read(overrides, unset):
    load_config(TINY, overrides, unset)


def test_unsetting_the_lora_keys_gives_their_defaults_and_changes_nothing_else():
    cfg = load_config(TINY, [PER_AGENT], NOT_LORA)
    assert (cfg.policy.lora_r, cfg.policy.lora_alpha, cfg.policy_mode) == (8, 16.0, "per_agent")
    plain = load_config(TINY, [PER_AGENT, "policy.lora_r=8", "policy.lora_alpha=16"])
    assert cfg == plain
