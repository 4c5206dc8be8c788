"""Documented config keys that nothing reads yet, each with the reason, and the warning setting one prints.

A key listed in :data:`INERT_KEYS` is accepted (configs written for OpenRLHF-style launch scripts carry it) but
changes nothing; :func:`inert_key_warnings` names each one a config sets to a non-default value, and
``marti train`` prints those lines. ``tests/unit/config/test_key_walk.py`` checks every other key has a consumer.
"""

from __future__ import annotations

from typing import Any

from marti.config.schema import TrainConfig

__all__ = ["INERT_KEYS", "inert_key_warnings"]

INERT_KEYS: dict[str, str] = {
    "agents.N.ref_model": "the reference model is always the agent's pretrain_model (not implemented yet)",
    "policy.disable_dropout": "the policy models keep their dropout probabilities (not implemented yet)",
    "strategy.init_on_gpu": "models are built on the CPU and moved to the device (not implemented yet)",
    "strategy.offload_reference_model": "the reference model stays on the device (not implemented yet)",
    "strategy.critic_zero_stage": "critics train with strategy.zero_stage (not implemented yet)",
    "output.log_every": "metrics are written every step (not implemented yet)",
}
"""Dotted key -> why setting it changes nothing today."""


def _values(cfg: Any, dotted: str) -> list[Any]:
    """The values at a dotted key; ``agents.N.x`` gives one per agent."""
    nodes = [cfg]
    for part in dotted.split("."):
        nodes = [item for n in nodes for item in n] if part == "N" else [getattr(n, part) for n in nodes]
    return nodes


def inert_key_warnings(cfg: TrainConfig) -> list[str]:
    """One warning per :data:`INERT_KEYS` key that ``cfg`` sets to a non-default value, in table order.

    Example: ``policy.disable_dropout=True has no effect: the policy models keep their dropout probabilities``.
    """
    default = TrainConfig(training_name="x", agents=[{"name": "a", "pretrain_model": "m", "role": "r"}])
    out = []
    for key, reason in INERT_KEYS.items():
        default_value = _values(default, key)[0]
        changed = [v for v in _values(cfg, key) if v != default_value]
        if changed:
            out.append(f"{key}={changed[0]!r} has no effect: {reason}")
    return out
