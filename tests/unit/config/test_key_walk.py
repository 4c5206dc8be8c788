"""Every documented config key does something.

Walks the keys of docs/config.md's generated KEYS block (``config_reference_markdown``). For each key:

- keys of the sections with a builder (``algorithm``, ``policy``, ``strategy``, ``vllm``, sampling) must change
  what the builders produce when set to a non-default value (:func:`_fingerprint`: algorithm settings,
  optimizer settings, policy layout, engine counts and kwargs, sampling parameters; not the raw config), or
  name in :data:`EFFECT_TESTS` the existing test that shows their run-time effect;
- every key must be read somewhere outside the config package's loading and docs code (an attribute access
  ``.leaf`` or a ``"leaf"`` string in ``services/`` / ``marti/`` or a schema property).

A key added to the schema without a consumer fails here: there is no list of accepted-but-inert keys.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path
from typing import Any

import pytest

from marti.config import TrainConfig, config_from_dict, config_reference_markdown

ROOT = Path(__file__).resolve().parents[3]
KEYS = re.findall(r"^\| `([^`]+)` \|", config_reference_markdown(), re.M)
BUILT = ("algorithm.", "policy.", "strategy.", "vllm.")

BASE: dict[str, Any] = {
    "training_name": "t",
    "agents": [
        {"name": "a", "pretrain_model": "m", "role": "planner"},
        {"name": "b", "pretrain_model": "m", "role": "executor"},
    ],
    "device": "cuda",
}


def _sources() -> str:
    files = [p for p in (ROOT / "services").rglob("*.py")] + [p for p in (ROOT / "marti").rglob("*.py")]
    skip = {ROOT / "marti" / "config" / n for n in ("load.py", "docs.py", "__init__.py")}
    skip |= {ROOT / "marti" / "launch_flags.py"}
    text = []
    for p in files:
        if p in skip:
            continue
        body = p.read_text(encoding="utf-8")
        if p.name == "schema.py":  # only what the schema's own properties and validators read
            body = "\n".join(ln for ln in body.splitlines() if not re.match(r"\s+\w+: .*=", ln))
        text.append(body)
    return "\n".join(text)


SOURCES = _sources()


def _fingerprint(cfg: TrainConfig) -> str:
    """What the config-consuming builders produce: algorithm settings, policy layout, train engine settings,
    engine counts and sampling parameters."""
    import torch

    from services.trainer.generation import engine_count, sampling_params
    from services.trainer.rollout.vllm_engine import engine_settings
    from services.trainer.worker import (
        ALGORITHM_KEYS_OUTSIDE_ALGO_CONFIG,
        algo_config,
        build_strategy,
        policy_config,
    )

    lin = torch.nn.Linear(1, 1)
    # The optimizer settings do not depend on strategy.name; torch builds them without starting DeepSpeed.
    cfg_t = cfg.model_copy(update={"strategy": cfg.strategy.model_copy(update={"name": "torch"})})
    optim = build_strategy(
        cfg_t, "a", lin, list(lin.parameters())
    ).cfg  # schedule length: ppo_epochs, total_steps
    critic_optim = build_strategy(
        cfg_t, "a", lin, list(lin.parameters()), lr=cfg.algorithm.critic_learning_rate
    ).cfg

    parts: list[Any] = [
        dataclasses.asdict(algo_config(cfg)),
        optim,
        critic_optim,
        # consumers named and checked in tests/unit/trainer/test_algo_config_mapping.py (normalize_reward)
        {k: getattr(cfg.algorithm, k) for k in ALGORITHM_KEYS_OUTSIDE_ALGO_CONFIG},
        policy_config(cfg),
        engine_count(cfg, "vllm"),
        engine_settings(cfg.vllm),  # the vLLM engine's kwargs (VLLMRolloutEngine.from_policy)
        [sampling_params(cfg, a.name) for a in cfg.agents],
    ]
    return repr(parts)


def _other_value(cfg: TrainConfig, key: str) -> Any:
    """A valid non-default value for ``key`` (from its type)."""
    model: Any = TrainConfig
    node: Any = cfg
    for part in key.split(".")[:-1]:
        if part == "N":
            node = node[0]
            continue
        node = getattr(node, part)
    leaf = key.split(".")[-1]
    info = type(node).model_fields[leaf]
    current = getattr(node, leaf)
    del model
    tp = info.annotation
    union = typing.get_origin(tp) in (typing.Union, types.UnionType)
    args = [a for a in typing.get_args(tp) if a is not type(None)] if union else [tp]
    base = args[0]
    if typing.get_origin(base) is typing.Annotated:
        base = typing.get_args(base)[0]
    if typing.get_origin(base) is typing.Literal:
        return next(v for v in typing.get_args(base) if v != current)
    if base is bool:
        return not current
    if base is int:
        return 1 if current in (None, 0) else (0 if leaf.endswith("stage") else current + 1)
    if base is float:
        if leaf == "dual_clip":
            return 3.0
        return 0.5 if current in (None, 0.0, 1.0) else current / 2
    if typing.get_origin(base) is list and typing.get_args(base)[0] is str:
        return ["q_proj"] if current != ["q_proj"] else ["v_proj"]
    if base is str:
        return "another-model"
    return None


def _set(raw: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    import copy

    out = copy.deepcopy(raw)
    node: Any = out
    parts = key.replace(".N.", ".0.").split(".")
    for part in parts[:-1]:
        node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
    node[parts[-1]] = value
    return out


def test_the_walk_sees_every_section():
    assert len(KEYS) > 150 and "algorithm.normalize_reward" in KEYS and "policy.ema" in KEYS


@pytest.mark.parametrize("key", KEYS)
def test_every_key_is_read(key):
    leaf = key.split(".")[-1]
    pattern = rf"(\.{re.escape(leaf)}\b|[\"']{re.escape(leaf)}[\"'])"
    assert re.search(pattern, SOURCES), f"{key}: nothing reads it; implement it or remove it from the schema"


#: Keys of the built sections whose effect shows only at run time (which model is built, which weights
#: evaluation uses, which DeepSpeed engine trains): each names the test that fails when the key does nothing.
EFFECT_TESTS = {
    "policy.mode": "tests/unit/trainer/test_policy.py::test_lora_mode_keeps_one_base_copy_and_separate_adapters",
    "policy.ema": "tests/unit/trainer/test_ema.py::test_evaluation_uses_the_ema_weights_and_rollouts_the_trained_ones",
    "policy.ema_beta": "tests/unit/trainer/test_ema.py::test_ema_equals_the_hand_computed_average_after_each_optimizer_step",
    "strategy.name": "tests/unit/trainer/test_strategy.py::test_make_strategy_by_name",
    "strategy.zero_stage": "tests/unit/trainer/test_strategy.py::test_deepspeed_zero_stages_train_and_resume_on_cpu",
    "strategy.critic_zero_stage": (
        "tests/unit/trainer/test_openrlhf_settings.py::test_critic_zero_stage_reaches_the_critics_deepspeed_config"
    ),
}  # fmt: skip


@pytest.mark.parametrize("key", sorted(EFFECT_TESTS))
def test_each_effect_test_exists(key):
    path, name = EFFECT_TESTS[key].split("::")
    body = (ROOT / path).read_text()
    match = re.search(rf"^def {name}\(.*?(?=^def |\Z)", body, re.M | re.S)
    assert match, f"{key}: {EFFECT_TESTS[key]} does not exist"
    assert key in KEYS


@pytest.mark.parametrize("key", [k for k in KEYS if k.startswith(BUILT) and k not in EFFECT_TESTS])
def test_built_section_keys_change_what_the_builders_produce(key):
    base = config_from_dict(BASE)
    if key == "strategy.zero_stage" or key == "strategy.critic_zero_stage":
        raw = _set(_set(BASE, "strategy.name", "deepspeed"), key, 2)
        base = config_from_dict(_set(BASE, "strategy.name", "deepspeed"))
    else:
        value = _other_value(base, key)
        if value is None:
            pytest.skip(f"{key}: no generic non-default value")  # lists: covered by the source walk
        raw = _set(BASE, key, value)
    changed = config_from_dict(raw)
    assert _fingerprint(changed) != _fingerprint(base), f"{key}: no builder output changes"
