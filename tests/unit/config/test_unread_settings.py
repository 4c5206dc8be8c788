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
        load_config(TINY, ["policy.mode=shared", FROZEN])
    load_config(TINY, ["policy.mode=shared"])
    for mode in ("lora", "per_agent"):
        assert load_config(TINY, [f"policy.mode={mode}", FROZEN]).tuning_agents == ["agent_1"]
