"""Unit tests of marti.config: the seed format, the example configs, validation and error messages."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from marti.config import (
    RayConfig,
    RolloutConfig,
    TrainConfig,
    config_from_dict,
    config_from_text,
    dump_config,
    load_config,
    parse_byte_size,
)
from marti.errors import InvalidArgumentError

ROOT = Path(__file__).resolve().parents[3]
DESIGN_YAML = ROOT / "examples" / "design" / "multi_agent_collaboration.yaml"
EXAMPLES = ROOT / "examples"


def minimal(**extra) -> dict:
    """A small valid raw config: two agents on one model."""
    data = {
        "training_name": "t",
        "agents": [
            {"name": "a", "pretrain_model": "m", "role": "planner"},
            {"name": "b", "pretrain_model": "m", "role": "executor"},
        ],
    }
    data.update(extra)
    return data


def error_of(data: dict, overrides=()) -> str:
    with pytest.raises(InvalidArgumentError) as info:
        config_from_dict(data, overrides, source="cfg.yaml")
    return str(info.value)


def test_design_example_loads_exactly_as_written():
    cfg = load_config(DESIGN_YAML)
    assert cfg.training_name == "multi_agent_collaboration_task"
    assert cfg.num_agents == 3 and [a.name for a in cfg.agents] == ["agent_1", "agent_2", "agent_3"]
    # YAML 1.1 reads 2e-5 as a string; the schema accepts it as a float.
    assert yaml.safe_load(DESIGN_YAML.read_text())["learning_rate"] == "2e-5"
    assert math.isclose(cfg.learning_rate, 2e-5)
    assert cfg.agents[1].pretrain_model == "mistralai/Mistral-7B-Instruct-v0.1"
    assert cfg.agents[2].capabilities == ["evaluation", "feedback"]
    assert cfg.agents[0].num_gpus == 1 and cfg.agents[0].num_cpus == 4
    assert cfg.environment.scenario == "resource_allocation" and cfg.environment.max_turns == 50
    assert cfg.ray.address == "auto" and cfg.ray.object_store_memory == 20 * 10**9
    assert cfg.vllm.num_engines == 3 and cfg.vllm.max_num_seqs == 256
    # Heterogeneous base models: auto policy mode is one model per agent.
    assert cfg.policy_mode == "per_agent"
    assert cfg.run_dir == Path("runs/multi_agent_collaboration_task")


@pytest.mark.parametrize("name", ["resource_allocation.yaml", "tiny.yaml"])
def test_example_configs_load(name):
    cfg = load_config(EXAMPLES / name)
    assert cfg.policy_mode == "lora"
    assert cfg.rollout.engine == "hf" and cfg.device == "cpu"
    assert len({a.pretrain_model for a in cfg.agents}) == 1


def test_resource_allocation_example_is_the_design_structure_sized_for_cpu():
    cfg = load_config(EXAMPLES / "resource_allocation.yaml")
    assert [a.role for a in cfg.agents] == ["planner", "executor", "evaluator"]
    assert all(a.pretrain_model == "smollm2-135m-instruct" for a in cfg.agents)
    assert cfg.environment.env_name == "collaborative_task_solving"
    assert cfg.environment.scenario == "resource_allocation"
    assert cfg.ray.address is None and cfg.vllm.num_engines == 1
    assert cfg.max_steps <= 10 and cfg.rollout.max_new_tokens <= 64
    assert cfg.budget.max_wall_time_s is not None and cfg.budget.max_wall_time_s <= 900


def test_defaults_and_derived_values():
    cfg = config_from_dict(minimal())
    assert cfg.num_agents == 2
    assert cfg.tuning_agents == ["a", "b"]
    assert cfg.sampling_for("a").max_new_tokens == cfg.rollout.max_new_tokens
    assert cfg.learning_rate_for("b") == cfg.learning_rate
    assert cfg.warmup_steps == 0
    assert cfg.output.log_with == ["tensorboard"]


def test_dump_round_trips():
    cfg = load_config(EXAMPLES / "resource_allocation.yaml", ["agents.1.sampling.temperature=0.5"])
    again = config_from_text(dump_config(cfg))
    assert again == cfg


def test_frozen():
    cfg = config_from_dict(minimal())
    with pytest.raises(Exception, match="frozen"):
        cfg.max_steps = 3  # type: ignore[misc]


def test_unknown_keys_are_named_with_their_path():
    assert "unknown key 'foo'" in error_of(minimal(foo=1))
    msg = error_of(minimal(algorithm={"kl_coeff": 0.1}))
    assert "unknown key 'algorithm.kl_coeff'" in msg and "kl_coef" in msg
    data = minimal()
    data["agents"][1]["rol"] = "x"
    assert "unknown key 'agents.1.rol'" in error_of(data)
    data = minimal()
    data["agents"][0]["sampling"] = {"temp": 1}
    assert "unknown key 'agents.0.sampling.temp'" in error_of(data)


def test_missing_required_keys_are_named():
    data = minimal()
    del data["agents"][0]["role"]
    assert "missing required key 'agents.0.role'" in error_of(data)
    assert "missing required key 'training_name'" in error_of({"agents": minimal()["agents"]})


def test_bad_values_name_key_and_value():
    msg = error_of(minimal(learning_rate="fast"))
    assert "'learning_rate'" in msg and "'fast'" in msg
    msg = error_of(minimal(rollout={"engine": "tgi"}))
    assert "'rollout.engine'" in msg and "'tgi'" in msg
    assert "'max_steps'" in error_of(minimal(max_steps=0))
    assert "'training_name'" in error_of(minimal(training_name="../etc"))


def test_num_agents_must_match_agents():
    msg = error_of(minimal(num_agents=3))
    assert "num_agents is 3" in msg and "lists 2" in msg and "a, b" in msg


def test_agent_names_distinct_and_team_nonempty():
    data = minimal()
    data["agents"][1]["name"] = "a"
    assert "repeated: a" in error_of(data)
    assert "at least one agent" in error_of(minimal(agents=[]))


def test_lora_and_shared_need_one_base_model():
    data = minimal(policy={"mode": "lora"})
    data["agents"][1]["pretrain_model"] = "other"
    msg = error_of(data)
    assert "policy.mode=lora" in msg and "b=other" in msg
    data["policy"] = {"mode": "auto"}
    assert config_from_dict(data).policy_mode == "per_agent"


def test_group_estimators_need_groups():
    msg = error_of(minimal(rollout={"group_size": 1, "episodes_per_step": 4}))
    assert "group_size >= 2" in msg and "grpo" in msg
    cfg = config_from_dict(
        minimal(
            algorithm={"advantage_estimator": "reinforce++"},
            rollout={"group_size": 1, "episodes_per_step": 3},
        )
    )
    assert cfg.rollout.problems_per_step == 3


def test_episodes_multiple_of_group():
    msg = error_of(minimal(rollout={"group_size": 3, "episodes_per_step": 8}))
    assert "episodes_per_step (8)" in msg and "group_size (3)" in msg


def test_frozen_team_is_an_error():
    data = minimal()
    for agent in data["agents"]:
        agent["is_tuning"] = False
    assert "nothing to train" in error_of(data)
    data["agents"][0]["is_tuning"] = True
    assert config_from_dict(data).tuning_agents == ["a"]


def test_ema_takes_either_transformers_engine_and_the_vllm_refusal_names_both():
    for engine in ("hf", "hf_static"):
        assert config_from_dict(minimal(policy={"ema": True}, rollout={"engine": engine})).policy.ema
    said = error_of(minimal(policy={"ema": True}, rollout={"engine": "vllm"}))
    assert "a transformers engine (rollout.engine hf or hf_static); rollout.engine=vllm cannot" in said
    from marti.config import config_reference_markdown

    row = next(r for r in config_reference_markdown().splitlines() if r.startswith("| `policy.ema` |"))
    assert "Needs a transformers engine (``rollout.engine: hf`` or ``hf_static``)" in row


def test_vllm_on_cpu_and_zero_stage_without_deepspeed():
    assert "rollout.engine=vllm" in error_of(minimal(device="cpu", rollout={"engine": "vllm"}))
    assert "strategy.name=deepspeed" in error_of(minimal(strategy={"zero_stage": 2}))
    assert config_from_dict(minimal(strategy={"name": "deepspeed", "zero_stage": 3})).strategy.zero_stage == 3
    assert "'strategy.zero_stage'" in error_of(minimal(strategy={"name": "deepspeed", "zero_stage": 4}))


@pytest.mark.parametrize(
    ("section", "key", "ok", "bad"),
    [
        ("algorithm", "gamma", 1.0, 1.0001),
        ("algorithm", "clip_eps_low", 0.0, 1.0),
        ("algorithm", "dual_clip", 1.0001, 1.0),
        ("algorithm", "kl_coef", 0.0, -1e-9),
        ("rollout", "top_p", 1.0, 0.0),
        ("rollout", "temperature", 0.0, -0.1),
        ("vllm", "gpu_memory_utilization", 1.0, 1.01),
        ("policy", "lora_dropout", 0.0, 1.0),
        ("reward_alloc", "role_weight", 0.0, -0.5),
        ("budget", "max_wall_time_s", 0.001, 0.0),
        ("output", "log_every", 1, 0),
    ],
)
def test_limits_at_their_edges(section, key, ok, bad):
    assert getattr(getattr(config_from_dict(minimal(**{section: {key: ok}})), section), key) == ok
    msg = error_of(minimal(**{section: {key: bad}}))
    assert f"'{section}.{key}'" in msg and repr(bad) in msg


def test_reward_alloc_needs_some_weight():
    assert "both 0" in error_of(minimal(reward_alloc={"team_weight": 0, "role_weight": 0}))


def test_eval_seeds():
    r = RolloutConfig(eval_episodes=3)
    assert r.resolved_eval_seeds == [1_000_000, 1_000_001, 1_000_002]
    assert RolloutConfig(eval_seeds=[7, 9, 11], eval_episodes=2).resolved_eval_seeds == [7, 9]
    assert "duplicates" in error_of(minimal(rollout={"eval_seeds": [1, 1], "eval_episodes": 1}))
    assert "exceeds the 2" in error_of(minimal(rollout={"eval_seeds": [1, 2], "eval_episodes": 3}))
    msg = error_of(minimal(rollout={"eval_seeds": [5, 50], "eval_episodes": 2, "num_train_seeds": 10}))
    assert "[5]" in msg and "[0, 10)" in msg


def test_train_seeds_groups_wrap_and_skip_held_out():
    r = RolloutConfig(episodes_per_step=4, group_size=2, eval_seeds=[1, 3, 4], eval_episodes=3)
    # Unbounded training seeds never hit a held-out seed: 0, 2, 5, 6, 7, 8, ...
    flat = [r.train_seeds(s) for s in range(3)]
    assert flat == [[0, 0, 2, 2], [5, 5, 6, 6], [7, 7, 8, 8]]
    finite = RolloutConfig(
        episodes_per_step=4, group_size=2, num_train_seeds=3, train_seed_start=10, eval_episodes=1
    )
    assert [finite.train_seeds(s) for s in range(2)] == [[10, 10, 11, 11], [12, 12, 10, 10]]
    with pytest.raises(InvalidArgumentError, match="step must be >= 0"):
        r.train_seeds(-1)


def test_train_seeds_against_brute_force():
    held = [0, 2, 3, 9, 10, 11]
    r = RolloutConfig(episodes_per_step=3, group_size=1, eval_seeds=held, eval_episodes=6)
    expected = [s for s in range(100) if s not in held][:30]
    got = [seed for step in range(10) for seed in r.train_seeds(step)]
    assert got == expected


def test_sampling_overrides_and_per_agent_lr():
    data = minimal(rollout={"temperature": 0.7, "max_new_tokens": 32})
    data["agents"][1]["sampling"] = {"temperature": 0.0}
    data["agents"][1]["learning_rate"] = "3e-4"
    cfg = config_from_dict(data)
    assert cfg.sampling_for("a").temperature == 0.7
    assert cfg.sampling_for("b").temperature == 0.0 and cfg.sampling_for("b").max_new_tokens == 32
    assert cfg.learning_rate_for("b") == pytest.approx(3e-4)
    with pytest.raises(InvalidArgumentError, match="no agent 'c'"):
        cfg.agent("c")


def test_warmup_steps():
    assert config_from_dict(minimal(max_steps=40, lr_warmup_ratio=0.05)).warmup_steps == 2
    assert config_from_dict(minimal(max_steps=40, lr_warmup_ratio=0.05, lr_warmup_steps=7)).warmup_steps == 7


@pytest.mark.parametrize(
    ("text", "expected"),
    [("20GB", 20 * 10**9), ("512MiB", 512 * 2**20), ("1.5g", 1_500_000_000), ("100", 100), (4096, 4096)],
)
def test_byte_sizes(text, expected):
    assert parse_byte_size(text) == expected
    assert RayConfig(object_store_memory=text).object_store_memory == expected


@pytest.mark.parametrize("bad", ["20 parsecs", "-1GB", "GB", -5, True])
def test_bad_byte_sizes(bad):
    with pytest.raises(InvalidArgumentError):
        parse_byte_size(bad)
    assert "'ray.object_store_memory'" in error_of(minimal(ray={"object_store_memory": bad}))


def test_load_config_file_errors(tmp_path):
    with pytest.raises(InvalidArgumentError, match="cannot read config file"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("training_name: [unclosed\n")
    with pytest.raises(InvalidArgumentError, match="not valid YAML"):
        load_config(bad)
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(InvalidArgumentError, match="must be a YAML mapping"):
        load_config(listy)


def test_every_field_has_a_docstring():
    def walk(cls, prefix):
        for name, info in cls.model_fields.items():
            assert info.description, f"{prefix}{name} has no docstring"
            ann = info.annotation
            if isinstance(ann, type) and hasattr(ann, "model_fields"):
                walk(ann, f"{prefix}{name}.")

    walk(TrainConfig, "")


def test_staleness_bounds():
    cfg = config_from_dict(minimal(rollout={"max_staleness": 2}))
    assert cfg.max_staleness_for("a") == 2
    agents = minimal()["agents"]
    agents[1]["max_staleness"] = 0
    cfg = config_from_dict(minimal(agents=agents, rollout={"max_staleness": 1}))
    assert (cfg.max_staleness_for("a"), cfg.max_staleness_for("b")) == (1, 0)
    agents[1]["max_staleness"] = 2
    with pytest.raises(InvalidArgumentError, match=r"agents.1.max_staleness \(2, agent 'b'\) exceeds"):
        config_from_dict(minimal(agents=agents, rollout={"max_staleness": 1}))
    with pytest.raises(
        InvalidArgumentError, match="rollout.max_staleness=1 needs policy.mode lora or per_agent"
    ):
        config_from_dict(minimal(rollout={"max_staleness": 1}, policy={"mode": "shared"}))
    assert config_from_dict(minimal(policy={"mode": "shared"})).rollout.max_staleness == 0


@pytest.mark.parametrize("bad", [True, 1.0, "1"])
def test_a_staleness_bound_must_be_written_as_an_int(bad):
    with pytest.raises(InvalidArgumentError, match="rollout.max_staleness"):
        config_from_dict(minimal(rollout={"max_staleness": bad}))


@pytest.mark.parametrize("bad", [-1, True, 1.0, "1", None])
def test_merge_adapters_is_an_int_at_least_0_named_when_not(bad):
    """``rollout.merge_adapters`` (docs/config.md: int >= 0): 0 never merges; a negative, a bool, a float, text or
    null is refused naming the key and the value, as the engines refuse it (test_merged_lora)."""
    bf16 = {"dtype": "bfloat16"}  # a sampling copy to merge into: merge_adapters is read
    assert config_from_dict(minimal(rollout={**bf16, "merge_adapters": 0})).rollout.merge_adapters == 0
    msg = error_of(minimal(rollout={**bf16, "merge_adapters": bad}))
    assert "'rollout.merge_adapters'" in msg and repr(bad) in msg


@pytest.mark.parametrize(
    "template, named",
    [
        ("Solve {question} as {role}", "placeholder {question} is not one of {name}, {role}, {capabilities}"),
        ("You are {}", "placeholder {} is not one"),
        ("You are {name.upper}", "placeholder {name.upper} is not one"),
        ("Use {role", "braces do not pair up"),
        ("You are {name:d}", "cannot be filled in: Unknown format code 'd'"),
        # a placeholder nested in a format spec: a bare KeyError at load, or (one of the three) a ValueError
        # only when the job filled it in with a real role ("Invalid format specifier 'solver'")
        ("You are {name:{row}}", "placeholder {row} inside the format spec of {name}"),
        ("You are {name:>{role}}", "placeholder {role} inside the format spec of {name}"),
    ],
)
def test_a_system_prompt_template_naming_what_is_not_filled_in_is_refused_at_load(template, named):
    """A template with a placeholder other than {name}, {role}, {capabilities} (a dataset column, say) was
    accepted and crashed with a bare KeyError when the job built the prompts; it is refused at load, naming the
    key and the placeholder, in both places a template is written and in marti.team.workflow.Role."""
    from marti.team.workflow import Role

    with pytest.raises(InvalidArgumentError, match=r"'agents\.0\.prompt_template': ") as agent:
        config_from_dict(
            minimal(agents=[{"name": "a", "pretrain_model": "m", "role": "r", "prompt_template": template}])
        )
    role = minimal(workflow={"kind": "chain", "roles": [{"agent": "a", "system_prompt": template}]})
    with pytest.raises(InvalidArgumentError, match=r"'workflow\.roles\.0\.system_prompt': ") as wf:
        config_from_dict(role)
    with pytest.raises(InvalidArgumentError, match="Role 'a': system_prompt: ") as py:
        Role("a", system_prompt=template)
    for err in (agent, wf, py):
        assert named in str(err.value)


def test_a_system_prompt_template_with_its_placeholders_and_literal_braces_loads_and_fills_in():
    from marti.team.prompt_template import fill_prompt_template

    template = "{name} ({role}) can: {capabilities}; reply as {{json}}"
    cfg = config_from_dict(
        minimal(agents=[{"name": "a", "pretrain_model": "m", "role": "r", "prompt_template": template}])
    )
    assert cfg.agents[0].prompt_template == template
    assert (
        fill_prompt_template(template, name="a", role="r", capabilities="x, y")
        == "a (r) can: x, y; reply as {json}"
    )
