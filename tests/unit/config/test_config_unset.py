"""``--unset KEY`` (marti.config.unset_keys, load_config's and build_config's ``unset``): a key the YAML file sets
goes back to its default; an unknown key, a key the file does not set, a whole list item and a key an override
sets too are refused by name (docs/config.md, "Dotted overrides")."""

from __future__ import annotations

from pathlib import Path

import pytest

from marti.command.launch_flags import MachineInfo, build_config
from marti.config import load_config, unset_keys
from marti.errors import InvalidArgumentError

ROOT = Path(__file__).resolve().parents[3]
TINY = ROOT / "examples" / "tiny.yaml"
EXAMPLE = ROOT / "examples" / "resource_allocation.yaml"


def test_an_unset_key_takes_its_default_and_the_rest_of_the_file_stays():
    cfg = load_config(TINY, [], ["policy.lora_r", "agents.1.capabilities", "rollout.group_size"])
    assert (cfg.policy.lora_r, cfg.policy.lora_alpha, cfg.policy.mode) == (8, 8.0, "lora")
    assert (cfg.agents[1].capabilities, cfg.agents[0].capabilities) == ([], ["planning"])
    assert (cfg.rollout.group_size, cfg.rollout.episodes_per_step) == (4, 4)


def test_a_whole_section_can_be_unset_and_the_input_is_not_modified():
    raw = {
        "training_name": "x",
        "agents": [{"name": "a", "pretrain_model": "m", "role": "r"}],
        "rollout": {"a": 1},
    }
    out = unset_keys(raw, ["rollout"])
    assert "rollout" not in out and raw["rollout"] == {"a": 1}
    assert unset_keys({"environment": {"options": {"x": 1, "y": 2}}}, ["environment.options.x"]) == {
        "environment": {"options": {"y": 2}}
    }


@pytest.mark.parametrize(
    ("key", "fragment"),
    [
        (
            "policy.lora_rr",
            "unknown config key 'policy.lora_rr' in --unset 'policy.lora_rr' (did you mean 'lora_r'?)",
        ),
        ("algoritm.kl_coef", "unknown config key 'algoritm' in --unset 'algoritm.kl_coef'"),
        ("agents.0.rol", "unknown config key 'agents.0.rol'"),
        ("agents.2.role", "--unset 'agents.2.role': index 2 out of range, 'agents' has 2 items"),
        ("agents.0", "--unset 'agents.0': a whole list item cannot be unset"),
        ("max_steps.value", "'max_steps' is a single value"),
        ("policy..lora_r", "--unset key 'policy..lora_r' has an empty part"),
        ("policy.lora_dropout", "--unset policy.lora_dropout: the config does not set 'policy.lora_dropout'"),
        ("budget.max_wall_time_s", "the config does not set 'budget.max_wall_time_s'"),  # no budget section
        # a misspelt key under a section the file does not have is still named as unknown
        (
            "algorithm.kl_coeff",
            "unknown config key 'algorithm.kl_coeff' in --unset 'algorithm.kl_coeff' (did you mean 'kl_coef'?)",
        ),
        ("budget.max_wall_time", "unknown config key 'budget.max_wall_time' in --unset"),
        ("agents.0.sampling.top_p", "the config does not set 'agents.0.sampling.top_p'"),
        ("agents.0.sampling.top_k", "unknown config key 'agents.0.sampling.top_k' in --unset"),
        ("environment.options.x", "the config does not set 'environment.options.x'"),
    ],
)
def test_a_bad_unset_is_refused_naming_the_key(key, fragment):
    with pytest.raises(InvalidArgumentError) as info:
        load_config(TINY, [], [key])
    assert fragment in str(info.value), str(info.value)


def test_an_unknown_key_gets_the_message_set_gives():
    with pytest.raises(InvalidArgumentError) as by_set:
        load_config(TINY, ["policy.lora_rr=3"])
    with pytest.raises(InvalidArgumentError) as by_unset:
        load_config(TINY, [], ["policy.lora_rr"])
    assert str(by_unset.value) == str(by_set.value).replace("override", "--unset")


@pytest.mark.parametrize("override", ["policy.lora_r=2", "policy={mode: lora}", "policy.lora_r.x=1"])
def test_a_key_both_unset_and_set_is_refused(override):
    """Unset first, then set: the unset would do nothing, so one of the two is a mistake."""
    with pytest.raises(
        InvalidArgumentError, match=r"--unset policy.lora_r and the override .* give one of them"
    ):
        load_config(TINY, [override], ["policy.lora_r"])


def test_a_key_a_launch_flag_sets_cannot_be_unset():
    cpu = MachineInfo()
    cfg, _ = build_config(EXAMPLE, [], [], machine=cpu, unset=["learning_rate"])
    assert cfg.learning_rate == 1e-5  # the schema's default, not the file's 1e-3
    with pytest.raises(InvalidArgumentError, match=r"--unset learning_rate and the override 'learning_rate="):
        build_config(EXAMPLE, [], ["--learning_rate", "0.1"], machine=cpu, unset=["learning_rate"])
    with pytest.raises(InvalidArgumentError, match="unknown config key 'learning_rat' in --unset"):
        build_config(EXAMPLE, [], [], machine=cpu, unset=["learning_rat"])
