"""Refusing settings the rest of the config leaves unread: critic settings without the critic (``gae``), a
reference model and the KL's own options without the KL (``algorithm.kl_coef: 0``), ``algorithm`` options the
chosen estimator or loss aggregation does not read, ``policy.lora_*`` without LoRA adapters (``policy.mode``
other than ``lora``), ``rollout.merge_adapters`` where no engine merges adapters, ``policy.ema_beta`` without
``policy.ema``, training settings of a frozen agent (``is_tuning: false``). Called by ``TrainConfig``'s
validator, so such a job is refused at config load naming the keys, their values and the setting that makes them
unread (docs/config.md, "Rules").

Only a value other than the key's default is refused: a saved config (``config.yaml`` of a run folder writes
every key) loads again. A message for keys of the ``algorithm``, ``policy`` and ``rollout`` sections names the
command-line fix too: ``--unset KEY`` (``marti train`` / ``marti eval``) drops a key the YAML file sets, e.g. the
file's ``policy.lora_r`` under ``--set policy.mode=per_agent``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from marti.config.sections.algorithm import GROUP_ESTIMATORS

#: ``algorithm`` keys only the critic reads (``gae``): its value target, its value loss, its optimizer.
CRITIC_ALGORITHM_KEYS = ("lambd", "value_clip", "critic_learning_rate")
#: Estimators whose group baselines ``normalize_per_agent`` whitens (the others whiten over the batch already).
PER_AGENT_NORMALIZED = ("grpo", "dr_grpo", "rloo")
#: ``algorithm`` keys only the KL to the reference policy reads (none where ``kl_coef`` is 0).
KL_ALGORITHM_KEYS = ("kl_estimator", "use_kl_loss")
#: ``policy`` keys only the LoRA adapters read (``policy.mode`` ``lora``, or ``auto`` resolving to it).
LORA_POLICY_KEYS = ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules")


def _fix(found: list[str]) -> str:
    """``remove them (on the command line: --unset a --unset b)`` for the ``key=value ...`` strings ``found``."""
    keys = " ".join(f"--unset {s.split('=', 1)[0]}" for s in found)
    return f"remove {'it' if len(found) == 1 else 'them'} (on the command line: {keys})"


def _set(section: BaseModel, prefix: str, names: tuple[str, ...]) -> list[str]:
    """``prefix.name=value`` for each of ``names`` whose value in ``section`` is not the field's default."""
    out = []
    for name in names:
        value = getattr(section, name)
        default = type(section).model_fields[name].get_default(call_default_factory=True)
        if value != default:
            out.append(f"{prefix}.{name}={value} (default {default})")
    return out


def _agents_set(cfg: Any, name: str) -> list[str]:
    """``agents.i.name=value`` for each agent whose ``name`` key is set (not null)."""
    return [
        f"agents.{i}.{name}={getattr(a, name)}"
        for i, a in enumerate(cfg.agents)
        if getattr(a, name) is not None
    ]


def _algorithm_unread(algo: Any) -> list[str]:
    """Messages for ``algorithm`` keys the section's own choices leave unread (an
    :class:`marti.config.AlgorithmConfig`): ``normalize_advantages``, ``group_by`` and ``normalize_per_agent``
    by the estimator, ``gamma`` by the estimator and ``turn_rewards``, ``loss_norm_tokens`` by ``loss_agg_mode``."""
    est = algo.advantage_estimator
    out = []
    readers = (
        ("normalize_advantages", ("gae",), "whitens gae's advantages (the others normalise by construction)"),
        ("group_by", GROUP_ESTIMATORS, "chooses the groups of the group estimators"),
        (
            "normalize_per_agent",
            PER_AGENT_NORMALIZED,
            "whitens the group baselines of grpo, dr_grpo and rloo",
        ),
    )
    for key, estimators, what in readers:
        if est not in estimators:
            out += [
                f"{s} {what}; algorithm.advantage_estimator is {est}, which does not read it: remove it"
                for s in _set(algo, "algorithm", (key,))
            ]
    if est in PER_AGENT_NORMALIZED and algo.turn_rewards == "outcome":
        out += [
            f"{s} discounts per-token returns (gae, reinforce++) or per-turn ones (turn_rewards dense); "
            f"algorithm.advantage_estimator is {est} with turn_rewards outcome, which does not read it: remove it"
            for s in _set(algo, "algorithm", ("gamma",))
        ]
    if est != "grpo" and not (algo.normalize_per_agent and est in PER_AGENT_NORMALIZED):
        out += [
            f"{s} is added to the std that grpo (and normalize_per_agent with dr_grpo or rloo) divides by; "
            f"algorithm.advantage_estimator is {est} with normalize_per_agent {algo.normalize_per_agent}, "
            f"which divides by no such std and does not read it: {_fix([s])}"
            for s in _set(algo, "algorithm", ("adv_eps",))
        ]
    if algo.loss_agg_mode != "seq-mean-token-sum-norm":
        out += [
            f"{s} is the divisor of loss_agg_mode seq-mean-token-sum-norm; algorithm.loss_agg_mode is "
            f"{algo.loss_agg_mode}, which does not read it: remove it"
            for s in _set(algo, "algorithm", ("loss_norm_tokens",))
        ]
    return out


def _lora_unread(cfg: Any) -> list[str]:
    """Messages for the ``policy.lora_*`` keys without LoRA adapters, and ``rollout.merge_adapters`` where no
    engine merges adapters (``cfg`` a :class:`marti.config.TrainConfig`)."""
    mode = cfg.policy.mode if cfg.policy.mode != "auto" else f"auto (here {cfg.policy_mode})"
    out = []
    lora = _set(cfg.policy, "policy", LORA_POLICY_KEYS)
    if lora and cfg.policy_mode != "lora":
        out.append(
            f"{', '.join(lora)} configure the LoRA adapters, and policy.mode is {mode}, which trains no adapters: "
            f"{_fix(lora)} or set policy.mode lora"
        )
    merge = _set(cfg.rollout, "rollout", ("merge_adapters",))
    roll = cfg.rollout
    why = (
        f"policy.mode is {mode}, which trains no adapters"
        if cfg.policy_mode != "lora"
        else "rollout.engine is vllm, which merges nothing"
        if roll.engine == "vllm"
        else "rollout.dtype is null (the policy's dtype: no sampling copy to merge into)"
        if roll.dtype is None
        else ""
    )
    if merge and why:
        out.append(
            f"{merge[0]} is how many LoRA adapters a transformers engine samples from merged copies in "
            f"rollout.dtype; {why}: {_fix(merge)}"
        )
    return out


def unread_settings(cfg: Any) -> list[str]:
    """One message per group of settings ``cfg`` (a :class:`marti.config.TrainConfig`) would accept and not read.

    Returns:
        Messages naming the keys with their values and the key (with its value) that leaves them unread; empty
        when every setting is read.
    """
    problems = []
    est = cfg.algorithm.advantage_estimator
    if est != "gae":
        critic = _set(cfg.algorithm, "algorithm", CRITIC_ALGORITHM_KEYS) + _agents_set(cfg, "critic_model")
        if cfg.strategy.critic_zero_stage is not None:
            critic.append(f"strategy.critic_zero_stage={cfg.strategy.critic_zero_stage}")
        if critic:
            problems.append(
                f"{', '.join(critic)} configure the critic, which only algorithm.advantage_estimator=gae trains "
                f"(it is {est}, which uses no critic): remove them or set advantage_estimator gae"
            )
    if cfg.algorithm.kl_coef == 0:
        ref = _agents_set(cfg, "ref_model")
        if cfg.strategy.offload_reference_model:
            ref.append("strategy.offload_reference_model=True")
        if ref:
            problems.append(
                f"{', '.join(ref)} configure the reference policy, which algorithm.kl_coef=0 does not load "
                "(no KL): remove them or set kl_coef > 0"
            )
        kl = _set(cfg.algorithm, "algorithm", KL_ALGORITHM_KEYS)
        if kl:
            problems.append(
                f"{', '.join(kl)} configure the KL to the reference policy, which algorithm.kl_coef=0 turns off: "
                f"{_fix(kl)} or set kl_coef > 0"
            )
    problems += _lora_unread(cfg)
    problems += _algorithm_unread(cfg.algorithm)
    if not cfg.policy.ema:
        ema = _set(cfg.policy, "policy", ("ema_beta",))
        if ema:
            problems.append(
                f"{ema[0]} is the decay of policy.ema, which is false: remove it or set policy.ema true"
            )
    frozen = [
        f"agents.{i}.{key}={getattr(a, key)}"
        for i, a in enumerate(cfg.agents)
        if not a.is_tuning
        for key in ("learning_rate", "critic_model", "ref_model")
        if getattr(a, key) is not None
    ]
    if frozen:
        problems.append(
            f"{', '.join(frozen)} configure training, and those agents set is_tuning=false (frozen: never "
            "updated): remove them or set is_tuning true"
        )
    return problems
