"""The tables of the key walk (tests/unit/config/test_key_walk.py): the documented keys (:data:`KEYS`), the base
config, which builders each key must change, the effect tests, the settings a key applies under and the values
it is set to."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from marti.config import config_reference_markdown

ROOT = Path(__file__).resolve().parents[3]
KEYS = re.findall(r"^\| `([^`]+)` \|", config_reference_markdown(), re.M)
#: The import-path callables of the workflow keys (tests/unit/config/test_key_effects.py, loaded by path).
HELPERS = str(Path(__file__).resolve().with_name("test_key_effects.py"))

BASE: dict[str, Any] = {
    "training_name": "t",
    "agents": [
        {"name": "a", "pretrain_model": "m", "role": "planner"},
        {"name": "b", "pretrain_model": "m", "role": "executor"},
    ],
    "device": "cuda",
}


#: Builders of every key under a prefix (the longest matching prefix wins; :data:`KEY_BUILDERS` overrides).
SECTION_BUILDERS: dict[str, tuple[str, ...]] = {
    "algorithm.": ("learner",),
    "policy.": ("learner",),
    "strategy.": ("learner",),
    "vllm.": ("learner",),
    "agents.N.sampling.": ("learner",),
    "environment.": ("env",),
    "reward_alloc.": ("env",),
    "ray.": ("placement",),
    "services.": ("services",),
    "output.": ("run",),
    "budget.": ("run",),
    "workflow.": ("episodes",),
    "tasks.N.": ("env",),
    "curriculum.": ("curriculum",),
    "allocation.": ("allocation",),
    "gateway.": ("gateway",),
    "external.": ("run",),
    "rollout.": ("episodes",),
}

#: Builders of single keys: the top-level and per-agent keys, and the keys a section's builder does not see.
KEY_BUILDERS: dict[str, tuple[str, ...]] = {
    "training_name": ("episodes",),
    "max_steps": ("run", "learner"),
    "micro_train_batch_size": ("learner",),  # the LR schedule's length; the update: EFFECT_TESTS
    "gradient_accumulation_steps": ("learner",),
    "max_epochs": ("run", "learner"),
    "learning_rate": ("learner",),
    "lr_scheduler": ("learner",),
    "lr_warmup_ratio": ("learner",),
    "lr_warmup_steps": ("learner",),
    "seed": ("learner", "episodes"),  # the models' seed; the task draws
    "device": ("placement",),
    "task_sampling": ("episodes",),
    "agents.N.name": ("learner",),
    "agents.N.pretrain_model": ("learner",),
    "agents.N.role": ("env", "episodes"),
    "agents.N.num_gpus": ("placement",),
    "agents.N.num_cpus": ("placement",),
    "agents.N.capabilities": ("episodes",),
    "agents.N.is_tuning": ("learner", "run"),
    "agents.N.prompt_template": ("episodes",),
    "agents.N.learning_rate": ("learner",),
    "agents.N.ref_model": ("learner",),
    "agents.N.max_staleness": ("run",),
    "ray.colocate_models": ("placement", "learner"),
    "output.dir": ("episodes", "services"),
    "services.reconnect_timeout_s": ("services", "run"),  # the reconnects; how long an insert waits for room
    "tasks.N.name": ("episodes",),
    "tasks.N.weight": ("episodes",),
    "tasks.N.difficulty": ("env", "curriculum"),  # the task's env; the curriculum's first level
    "environment.difficulty": ("env", "curriculum"),
    "rollout.engine": ("engine",),
    "rollout.dtype": ("engine",),
    "rollout.merge_adapters": ("engine",),
    "rollout.source": ("run",),
    "rollout.episodes_per_step": ("episodes", "run"),
    "rollout.max_new_tokens": ("learner",),
    "rollout.temperature": ("learner",),
    "rollout.top_p": ("learner",),
    "rollout.eval_every": ("run",),
    "rollout.max_staleness": ("run", "placement"),
    "gateway.enabled": ("run", "placement"),
    "external.episode_timeout_s": ("gateway",),
}

#: Keys whose effect no builder shows (inside a model update, a loaded model or DeepSpeed engine, a config check):
#: the test that fails when the key does nothing.
EFFECT_TESTS = {
    "num_agents": "tests/unit/config/test_config_schema.py::test_num_agents_must_match_agents",
    "micro_train_batch_size": (
        "tests/unit/config/test_key_effects.py::test_the_policy_update_takes_its_settings_from_the_config"
    ),
    "gradient_accumulation_steps": (
        "tests/unit/config/test_key_effects.py::test_the_policy_update_takes_its_settings_from_the_config"
    ),
    "rollout.tis_cap": (
        "tests/unit/config/test_key_effects.py::test_the_policy_update_takes_its_settings_from_the_config"
    ),
    "agents.N.response_prefix": (
        "tests/unit/config/test_key_effects.py::test_response_prefix_ends_the_prompt_and_starts_the_text"
    ),
    "agents.N.critic_model": (
        "tests/unit/config/test_key_effects.py::test_critic_model_is_the_model_the_critic_is_loaded_from"
    ),
    "policy.mode": "tests/unit/trainer/models/test_policy.py::test_lora_mode_keeps_one_base_copy_and_separate_adapters",
    "policy.ema": "tests/unit/trainer/learn/test_ema.py::test_evaluation_uses_the_ema_weights_and_rollouts_the_trained_ones",
    "policy.ema_beta": "tests/unit/trainer/learn/test_ema.py::test_ema_equals_the_hand_computed_average_after_each_optimizer_step",
    "strategy.name": "tests/unit/trainer/strategy/test_strategy.py::test_make_strategy_by_name",
    "strategy.zero_stage": "tests/unit/trainer/strategy/test_strategy.py::test_deepspeed_zero_stages_train_and_resume_on_cpu",
    "strategy.critic_zero_stage": (
        "tests/unit/trainer/learn/test_openrlhf_settings.py::test_critic_zero_stage_reaches_the_critics_deepspeed_config"
    ),
    # the problems marti.data.load_problems builds from the section
    **{
        key: "tests/unit/data/test_data_key_effects.py::test_each_dataset_key_changes_the_loaded_problems"
        for key in KEYS if key.startswith("dataset.")
    },
    # the scores of the trainer's build_scorer (a real HTTP server, the reward-model actor class in-process)
    **{
        key: "tests/integration/rewards/test_reward_key_effects.py::test_each_reward_key_changes_the_scores"
        for key in KEYS if key.startswith("reward.") and not key.startswith("reward.judge_")
    },
    # the LLM judge's verdict is the reward, through EpisodeScorer and the episode runner
    "reward.judge_agent": "tests/unit/trainer/data/test_data_workflows.py::test_the_frozen_judges_verdict_is_the_reward",
    "reward.judge_pattern": "tests/unit/trainer/data/test_data_workflows.py::test_judge_pattern_reads_the_verdict",
    "reward.judge_pattern_timeout_s": "tests/unit/trainer/data/test_data_workflows.py::test_a_judge_pattern_that_backtracks_is_scored_0_with_a_warning_and_the_job_goes_on",
}  # fmt: skip

#: Settings a key takes effect beside, applied to both sides of the comparison; a list: the key is walked once
#: under each (a key with two consumers that need different settings).
RUN = {"max_steps": 4, "output.log_with": []}  # a short run; TensorBoard only where the key is about loggers
TASKS = {"tasks": [{"name": "t1"}, {"name": "t2"}]}
ROLE = {"workflow.roles": [{"agent": "a"}]}
CURRICULUM = {"curriculum.enabled": True}
ALLOCATION = {"allocation.enabled": True}
DEBATE = {"workflow.kind": "debate", "workflow.aggregator": "b"}
MIXED = {**RUN, "rollout.source": "mixed"}
GAE = {"algorithm.advantage_estimator": "gae"}  # the critic's keys: another estimator refuses them unread
CONTEXT: dict[str, dict[str, Any] | list[dict[str, Any]]] = {
    "max_steps": RUN,
    **{k: GAE for k in ("algorithm.lambd", "algorithm.value_clip", "algorithm.critic_learning_rate")},
    **{
        k: GAE
        for k in ("agents.N.critic_model", "strategy.critic_zero_stage", "algorithm.normalize_advantages")
    },
    "algorithm.loss_norm_tokens": {"algorithm.loss_agg_mode": "seq-mean-token-sum-norm"},  # its only reader
    "algorithm.gamma": {"algorithm.advantage_estimator": "reinforce++"},  # grpo's outcome scores: no discount
    "policy.ema_beta": {"policy.ema": True},
    "rollout.merge_adapters": {"rollout.dtype": "bfloat16"},  # only a sampling copy in another dtype merges
    "seed": TASKS,  # the task draws
    "max_epochs": {**RUN, "rollout.num_train_seeds": 2},  # epochs need a finite problem set
    "task_sampling": {**TASKS, "algorithm.advantage_estimator": "reinforce++"},  # episode draws: no groups
    # A template that names {capabilities}: the built-in system prompt does not list them.
    "agents.N.capabilities": {"agents.0.prompt_template": "{name}, {role}: {capabilities}"},
    "agents.N.max_staleness": {**RUN, "rollout.max_staleness": 2},
    "services.tls_ca_file": {
        "services.env": "env-host:1"
    },  # a given address: the embedded stack is plaintext
    "agents.N.is_tuning": RUN,
    "output.save_every": RUN,
    "output.keep_checkpoints": {**RUN, "output.save_every": 1},
    "output.log_every": RUN,
    "output.log_with": {"max_steps": 2},
    "output.wandb_project": {**RUN, "output.log_with": ["wandb"]},
    "output.wandb_run_name": {**RUN, "output.log_with": ["wandb"]},
    "budget.max_wall_time_s": RUN,
    "budget.stop_after_steps": RUN,
    "rollout.source": RUN,
    "rollout.episodes_per_step": RUN,
    "rollout.eval_every": RUN,
    "rollout.max_staleness": RUN,
    "gateway.enabled": RUN,
    "external.episodes_per_step": MIXED,
    "external.wait_timeout_s": MIXED,
    "workflow.order": {"workflow.kind": "chain"},
    "workflow.aggregator": DEBATE,
    "workflow.rounds": DEBATE,
    "workflow.next_speakers": {
        "workflow.kind": "custom",
        "workflow.next_speakers": f"{HELPERS}:first_speaker",
    },
    "workflow.reward_custom_weight": {"workflow.reward_fn": f"{HELPERS}:first_agent_wins"},
    "workflow.roles.N.agent": {"workflow.roles": [{"agent": "a", "system_prompt": "the role of {name}"}]},
    "workflow.roles.N.system_prompt": ROLE,
    "workflow.roles.N.prompt_builder": ROLE,
    "workflow.roles.N.parser": ROLE,
    "workflow.roles.N.scripted": {**ROLE, "agents.0.is_tuning": False},  # a script is not trained
    **{k: TASKS for k in KEYS if k.startswith("tasks.N.")},
    "tasks.N.difficulty": [TASKS, {**TASKS, **CURRICULUM}],
    "environment.difficulty": [{}, CURRICULUM],
    **{k: CURRICULUM for k in KEYS if k.startswith("curriculum.") and k != "curriculum.enabled"},
    # every episode succeeds, so a level rises once a full window is seen
    "curriculum.window": {**CURRICULUM, "curriculum.success_value": 0.5},
    **{k: ALLOCATION for k in KEYS if k.startswith("allocation.") and k != "allocation.enabled"},
}

#: Non-default values where :func:`_other_value`'s is invalid, takes no effect, or there is none (lists, dicts).
VALUES: dict[str, Any] = {
    "max_steps": 2,
    "lr_scheduler": "cosine_with_min_lr",  # every name: tests/unit/trainer/strategy/test_strategy.py
    "agents.N.num_cpus": 4.0,  # above ray.num_cpus_per_worker, the least an actor reserves
    "agents.N.capabilities": ["planning", "coordination"],
    "agents.N.max_staleness": 1,
    "environment.options": {"history_messages": 2},
    "tasks.N.options": {"history_messages": 2},
    "ray.address": "auto",
    "ray.num_cpus_per_worker": 2.0,  # above the agents' num_cpus
    "rollout.engine": "vllm",
    "rollout.dtype": "bfloat16",  # the transformers engines' kwargs; "auto" resolves per machine
    "rollout.episodes_per_step": 4,  # a multiple of group_size
    "rollout.group_size": 2,
    "rollout.eval_every": 2,
    "rollout.eval_seeds": list(range(100, 116)),  # eval_episodes of them
    "output.log_with": ["wandb"],
    "budget.max_wall_time_s": 1e-9,  # spent by the first step
    "gateway.host": "0.0.0.0",
    "gateway.resident_versions": 2,  # 1 is the null default's value without staleness
    "gateway.tool_parser": "mistral",
    "gateway.tool_parsers": {"b": "mistral"},
    "workflow.order": ["b", "a"],
    "workflow.aggregator": "a",
    "workflow.next_speakers": f"{HELPERS}:last_speaker",
    "workflow.factory": f"{HELPERS}:chain_of_the_last_agent",
    "workflow.reward_fn": f"{HELPERS}:first_agent_wins",
    "workflow.roles.N.agent": "b",
    "workflow.roles.N.prompt_builder": f"{HELPERS}:marked_prompt",
    "workflow.roles.N.parser": f"{HELPERS}:shouting_parser",
    "workflow.roles.N.scripted": f"{HELPERS}:scripted_reply",
    "curriculum.levels": ["medium", "hard"],
    "environment.difficulty": "medium",  # easy is the curriculum's first level
    "tasks.N.difficulty": "medium",
}

#: Sections and lists of sections: covered by their child keys.
CONTAINERS = [k for k in KEYS if any(other.startswith(k + ".") for other in KEYS)]


def builders_of(key: str) -> tuple[str, ...]:
    """The builders whose output ``key`` must change (none for a container or an effect-test-only key)."""
    if key in KEY_BUILDERS:
        return KEY_BUILDERS[key]
    prefixes = [p for p in SECTION_BUILDERS if key.startswith(p)]
    if key in CONTAINERS or key in EFFECT_TESTS or not prefixes:
        return ()
    return SECTION_BUILDERS[max(prefixes, key=len)]
