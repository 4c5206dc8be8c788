"""Unit tests of dotted ``--set KEY=VALUE`` overrides (marti.config.apply_overrides / load_config)."""

from __future__ import annotations

from pathlib import Path

import pytest

from marti.config import apply_overrides, config_from_dict, load_config
from marti.errors import InvalidArgumentError

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "resource_allocation.yaml"


def test_overrides_set_existing_and_absent_sections():
    cfg = load_config(
        EXAMPLE,
        [
            "algorithm.kl_coef=0.05",
            "agents.0.role=leader",
            "budget.max_wall_time_s=60",
            "services.broker=localhost:50051",
            "agents.2.sampling.max_new_tokens=16",
            "agents.1.capabilities=[a, b]",
            "max_steps=3",
        ],
    )
    assert cfg.algorithm.kl_coef == 0.05
    assert cfg.agents[0].role == "leader"
    assert cfg.budget.max_wall_time_s == 60
    assert cfg.services.broker == "localhost:50051"
    assert cfg.sampling_for("agent_3").max_new_tokens == 16
    assert cfg.agents[1].capabilities == ["a", "b"]
    assert cfg.max_steps == 3


def test_values_are_yaml_scalars():
    kl = "algorithm.kl_coef=0.01"  # the example's kl_coef 0 leaves use_kl_loss unread (refused)
    cfg = load_config(EXAMPLE, [kl, "algorithm.use_kl_loss=false", "ray.address=null", "learning_rate=2e-5"])
    assert cfg.algorithm.use_kl_loss is False and cfg.ray.address is None
    assert cfg.learning_rate == pytest.approx(2e-5)
    assert load_config(EXAMPLE, ["output.dir="]).output.dir is None


def test_later_overrides_win_and_input_is_not_modified():
    raw = {"training_name": "x", "agents": [{"name": "a", "pretrain_model": "m", "role": "r"}]}
    out = apply_overrides(raw, ["max_steps=3", "max_steps=5"])
    assert out["max_steps"] == 5 and "max_steps" not in raw


def test_free_form_mapping_accepts_any_key():
    cfg = load_config(EXAMPLE, ["environment.options.budget.units=12"])
    assert cfg.environment.options == {"budget": {"units": 12}}


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("algorithm.kl_coeff=0.1", "unknown config key 'algorithm.kl_coeff'"),
        ("algoritm.kl_coef=0.1", "unknown config key 'algoritm'"),
        ("agents.0.rol=x", "unknown config key 'agents.0.rol'"),
        ("agents.3.role=x", "index 3 out of range, 'agents' has 3 items"),
        ("agents.first.role=x", "'first' must be a list index"),
        ("max_steps.value=1", "'max_steps' is a single value"),
        ("agents.0.capabilities.0.x=1", "'agents.0.capabilities.0' is a single value"),
        ("max_steps", "is not KEY=VALUE"),
        ("=3", "is not KEY=VALUE"),
        ("algorithm..kl_coef=1", "has an empty part"),
        ("max_steps=[1", "is not a YAML scalar"),
    ],
)
def test_bad_overrides_name_the_key(override, fragment):
    with pytest.raises(InvalidArgumentError) as info:
        load_config(EXAMPLE, [override])
    assert fragment in str(info.value)


def test_suggestion_for_typos():
    with pytest.raises(InvalidArgumentError, match=r"did you mean 'kl_coef'"):
        load_config(EXAMPLE, ["algorithm.kl_coeff=0.1"])


def test_override_values_are_validated_with_the_key_named():
    with pytest.raises(InvalidArgumentError) as info:
        load_config(EXAMPLE, ["rollout.temperature=hot"])
    assert "'rollout.temperature'" in str(info.value) and "'hot'" in str(info.value)
    with pytest.raises(InvalidArgumentError, match="num_agents is 4 but agents lists 3"):
        load_config(EXAMPLE, ["num_agents=4"])


def test_whole_section_override():
    raw = {"training_name": "x", "agents": [{"name": "a", "pretrain_model": "m", "role": "r"}]}
    cfg = config_from_dict(raw, ["rollout={group_size: 2, episodes_per_step: 2}"])
    assert cfg.rollout.group_size == 2
