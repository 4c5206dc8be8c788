"""OpenRLHF-style launch flags (``--actor_model A B C --bf16 ...``) mapped onto the training config.

``marti train`` accepts the flags of the design's launch script (``train_multi_agent.sh``) besides a YAML file.
Each flag becomes one or more dotted config overrides (the table :data:`FLAG_TABLE`, rendered in
``docs/config.md``). A flag that does not apply on this machine (flash attention or ``--actor_init_on_gpu``
without CUDA, ``--bf16`` without bf16 support, ``--log_with wandb`` without wandb) is reported once (one line in the
returned ``warnings``, which ``marti train`` prints) and ignored. ``--dataset`` (or OpenRLHF's
``--prompt_data``), ``--input_key``, ``--label_key``, ``--eval_dataset`` and ``--max_samples`` set the ``dataset:``
section; ``--reward_model`` (or OpenRLHF's ``--reward_pretrain``) and ``--remote_rm_url`` set the ``reward:``
section (docs/datasets.md). An unknown flag is an :class:`~marti.errors.InvalidArgumentError` naming it.

Typical use (what ``marti train`` does)::

    config, warnings = build_config("examples/resource_allocation.yaml", ["max_steps=4"], ["--bf16", "--seed", "7"])
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from marti.config import AlgorithmConfig, TrainConfig, apply_overrides, config_from_dict, unset_keys
from marti.config.sections.dataset import DATASET_ENV
from marti.config.unread import CRITIC_ALGORITHM_KEYS
from marti.errors import InvalidArgumentError
from marti.plumbing.cpu_features import CPUINFO, cpu_has_bf16
from marti.plumbing.yaml_load import load_yaml, yaml_error_line

__all__ = [
    "FLAG_GROUPS",
    "FLAG_TABLE",
    "DEFAULT_ROLES",
    "LaunchFlags",
    "MachineInfo",
    "build_config",
    "flag_help",
    "flag_table_markdown",
    "parse_launch_flags",
]

DEFAULT_ROLES = ("planner", "executor", "evaluator")
"""Roles given to agents created from ``--actor_model`` when there is no YAML file (cycled)."""

ESTIMATOR_NAMES = {
    "gae": "gae",
    "reinforce": "reinforce++",
    "reinforce_baseline": "reinforce++_baseline",
    "group_norm": "grpo",
    "dr_grpo": "dr_grpo",
    "rloo": "rloo",
}
"""OpenRLHF's ``--advantage_estimator`` names -> marti's ``algorithm.advantage_estimator`` (marti's own names
``grpo``, ``reinforce++``, ``reinforce++_baseline`` are accepted as well)."""

OPENRLHF_DEFAULTS: dict[str, tuple[str, Any]] = {
    "algorithm.advantage_estimator": ("advantage_estimator", "gae"),
    "algorithm.use_kl_loss": ("use_kl_loss", False),
    "algorithm.kl_coef": ("init_kl_coef", 0.01),
    "algorithm.kl_estimator": ("kl_estimator", "k1"),
    "algorithm.lambd": ("lambd", 1.0),
    "algorithm.gamma": ("gamma", 1.0),
    "algorithm.value_clip": ("value_clip", 0.5),
    "learning_rate": ("actor_learning_rate", 1e-6),
    "algorithm.critic_learning_rate": ("critic_learning_rate", 9e-6),
    "rollout.group_size": ("n_samples_per_prompt", 1),
    "seed": ("seed", 42),
}
"""OpenRLHF's defaults (``openrlhf.cli.train_ppo_ray``) of the flags that decide what is trained, as
``config key -> (flag, value)``: a config built from launch flags alone (no YAML file) starts from them, so the
design's script trains what OpenRLHF would (PPO with a critic per agent, the KL as a reward penalty); flags given
override them. With a YAML file the file and marti's defaults apply (docs/config.md)."""


@dataclass(frozen=True)
class MachineInfo:
    """What this machine supports, as far as launch flags care.

    Attributes:
        has_cuda: A CUDA device is visible to torch.
        bf16_supported: bfloat16 training runs natively: on the CUDA device, or (no CUDA) on a CPU whose
            ``/proc/cpuinfo`` flags name ``avx512_bf16`` or ``amx_bf16`` (:func:`marti.plumbing.cpu_features.cpu_has_bf16`).
        flash_attn_installed: The ``flash_attn`` package is importable.
        wandb_installed: The ``wandb`` package is importable.
    """

    has_cuda: bool = False
    bf16_supported: bool = False
    flash_attn_installed: bool = False
    wandb_installed: bool = False

    @classmethod
    def detect(cls, cpuinfo: Path = CPUINFO) -> MachineInfo:
        """Probe this machine (imports torch if it is installed; no torch means no CUDA).

        Args:
            cpuinfo: Where the CPU's flags are read when there is no CUDA (tests pass their own file).
        """
        has_cuda = False
        if importlib.util.find_spec("torch") is not None:
            import torch

            has_cuda = bool(torch.cuda.is_available())
        if has_cuda:
            bf16 = bool(torch.cuda.is_bf16_supported())
        else:
            bf16 = cpu_has_bf16(cpuinfo)
        return cls(
            has_cuda=has_cuda,
            bf16_supported=bf16,
            flash_attn_installed=importlib.util.find_spec("flash_attn") is not None,
            wandb_installed=importlib.util.find_spec("wandb") is not None,
        )


Kind = Literal["switch", "int", "float", "str", "models"]


@dataclass(frozen=True)
class _Flag:
    """One launch flag: how it is read, which config keys it sets, and when it does not apply."""

    kind: Kind
    keys: tuple[str, ...]
    """Config keys set to the flag's value (``agents.*.x`` for per-agent model lists)."""
    doc: str = ""
    fixed: tuple[tuple[str, Any], ...] = ()
    """Extra ``(key, value)`` overrides the flag implies, e.g. ``strategy.name=deepspeed``."""
    unavailable: Callable[[MachineInfo, Any], str | None] | None = None
    """Returns why the flag does not apply on this machine (then it is ignored), or None."""


def _no_cuda(m: MachineInfo, _v: Any) -> str | None:
    return None if m.has_cuda else "no CUDA device on this machine"


def _no_bf16(m: MachineInfo, _v: Any) -> str | None:
    return None if m.bf16_supported else "no device with bf16 training support here; training runs in fp32"


def _no_vllm(m: MachineInfo, _v: Any) -> str | None:
    return None if m.has_cuda else "vLLM needs CUDA; a transformers engine samples here (vllm.* unused)"


def _no_flash(m: MachineInfo, _v: Any) -> str | None:
    if not m.has_cuda:
        return "flash attention needs CUDA; transformers picks its default attention"
    return None if m.flash_attn_installed else "the flash_attn package is not installed"


def _no_wandb(m: MachineInfo, v: Any) -> str | None:
    if v == "wandb" and not m.wandb_installed:
        return "wandb is not installed; metrics.jsonl and TensorBoard are still written"
    return None


FLAG_TABLE: dict[str, _Flag] = {
    # models, one per agent (or one for all)
    "actor_model": _Flag("models", ("agents.*.pretrain_model",), "one model per agent, or one for all"),
    "critic_model": _Flag(
        "models",
        ("agents.*.critic_model",),
        "one per agent, or one for all; gae only: noted and ignored with another estimator",
    ),
    "ref_model": _Flag("models", ("agents.*.ref_model",), "one per agent, or one for all"),
    # rewards of dataset problems (docs/datasets.md)
    "reward_model": _Flag("str", ("reward.model",), "a one-label sequence classifier folder, or tiny-llama"),
    "reward_pretrain": _Flag("str", ("reward.model",), "OpenRLHF's name for --reward_model"),
    "remote_rm_url": _Flag("str", ("reward.remote_url",), "an OpenRLHF remote reward server"),
    # data (docs/datasets.md)
    "dataset": _Flag(
        "str", ("dataset.path",), "json:PATH, PATH.jsonl/.parquet/.csv, a saved folder, org/name"
    ),
    "prompt_data": _Flag("str", ("dataset.path",), "OpenRLHF's name for --dataset"),
    "input_key": _Flag("str", ("dataset.input_key",), "the prompt column"),
    "label_key": _Flag("str", ("dataset.label_key",), "the label column"),
    "eval_dataset": _Flag("str", ("dataset.eval_path",), "the held-out source"),
    "max_samples": _Flag("int", ("dataset.max_samples",), "first N rows of each source"),
    # sizes and schedule
    "num_agents": _Flag("int", ("num_agents",)),
    "max_steps": _Flag("int", ("max_steps",)),
    "micro_train_batch_size": _Flag("int", ("micro_train_batch_size",)),
    "gradient_accumulation_steps": _Flag("int", ("gradient_accumulation_steps",)),
    "ppo_epochs": _Flag("int", ("algorithm.ppo_epochs",)),
    "max_epochs": _Flag("int", ("max_epochs",)),
    "learning_rate": _Flag("float", ("learning_rate",)),
    "actor_learning_rate": _Flag("float", ("learning_rate",), "same key as --learning_rate"),
    "critic_learning_rate": _Flag(
        "float", ("algorithm.critic_learning_rate",), "gae only: noted and ignored with another estimator"
    ),
    "num_warmup_steps": _Flag("int", ("lr_warmup_steps",)),
    "lr_scheduler": _Flag("str", ("lr_scheduler",)),
    "seed": _Flag("int", ("seed",)),
    "rollout_batch_size": _Flag(
        "int", ("rollout.episodes_per_step",), "marti counts episodes: N/group_size problems per step"
    ),
    "n_samples_per_prompt": _Flag("int", ("rollout.group_size",)),
    "generate_max_len": _Flag("int", ("rollout.max_new_tokens",)),
    "temperature": _Flag("float", ("rollout.temperature",)),
    "top_p": _Flag("float", ("rollout.top_p",)),
    # algorithm
    "advantage_estimator": _Flag(
        "str",
        ("algorithm.advantage_estimator",),
        "OpenRLHF's names too: group_norm, reinforce, reinforce_baseline",
    ),
    "init_kl_coef": _Flag("float", ("algorithm.kl_coef",)),
    "kl_estimator": _Flag("str", ("algorithm.kl_estimator",)),
    "use_kl_loss": _Flag("switch", ("algorithm.use_kl_loss",)),
    "eps_clip": _Flag("float", ("algorithm.clip_eps_low", "algorithm.clip_eps_high")),
    "value_clip": _Flag(
        "float", ("algorithm.value_clip",), "gae only: noted and ignored with another estimator"
    ),
    "dual_clip": _Flag("float", ("algorithm.dual_clip",)),
    "gamma": _Flag("float", ("algorithm.gamma",)),
    "lambd": _Flag("float", ("algorithm.lambd",), "gae only: noted and ignored with another estimator"),
    "entropy_loss_coef": _Flag("float", ("algorithm.entropy_coef",)),
    "normalize_reward": _Flag("switch", ("algorithm.normalize_reward",)),
    # strategy and memory
    "actor_init_on_gpu": _Flag("switch", ("strategy.init_on_gpu",), "CUDA only", unavailable=_no_cuda),
    "enable_ema": _Flag("switch", ("policy.ema",)),
    "bf16": _Flag("switch", ("strategy.bf16",), "needs bf16 support", unavailable=_no_bf16),
    "zero_stage": _Flag("int", ("strategy.zero_stage",), "", fixed=(("strategy.name", "deepspeed"),)),
    "actor_zero_stage": _Flag(
        "int",
        ("strategy.zero_stage",),
        "",
        fixed=(("strategy.name", "deepspeed"),),
    ),
    "critic_zero_stage": _Flag(
        "int",
        ("strategy.critic_zero_stage",),
        "gae only: noted and ignored with another estimator",
        fixed=(("strategy.name", "deepspeed"),),
    ),
    "offload_reference_model": _Flag(
        "switch", ("strategy.offload_reference_model",), "CUDA only", unavailable=_no_cuda
    ),
    "disable_actor_dropout": _Flag("switch", ("policy.disable_dropout",)),
    "gradient_checkpointing": _Flag("switch", ("policy.gradient_checkpointing",)),
    "use_flash_attn": _Flag(
        "switch",
        ("policy.attn_implementation",),
        "sets flash_attention_2; CUDA and flash_attn only",
        unavailable=_no_flash,
    ),
    # vLLM
    "vllm_num_engines": _Flag("int", ("vllm.num_engines",), "CUDA only", unavailable=_no_vllm),
    "vllm_tensor_parallel_size": _Flag(
        "int", ("vllm.tensor_parallel_size",), "CUDA only", unavailable=_no_vllm
    ),
    "vllm_gpu_memory_utilization": _Flag(
        "float", ("vllm.gpu_memory_utilization",), "CUDA only", unavailable=_no_vllm
    ),
    "enable_prefix_caching": _Flag(
        "switch", ("vllm.enable_prefix_caching",), "CUDA only", unavailable=_no_vllm
    ),
    # output and logging
    "output_dir": _Flag("str", ("output.dir",)),
    "logging_steps": _Flag("int", ("output.log_every",)),
    "save_steps": _Flag("int", ("output.save_every",)),
    "log_with": _Flag(
        "str", ("output.log_with",), "tensorboard or wandb (wandb if installed)", unavailable=_no_wandb
    ),
    "wandb_project": _Flag("str", ("output.wandb_project",)),
    "wandb_run_name": _Flag("str", ("output.wandb_run_name",)),
}
"""Every launch flag marti accepts, keyed by name without the leading ``--``."""

FLAG_GROUPS: dict[str, tuple[str, ...]] = {
    "models": ("actor_model", "critic_model", "ref_model"),
    "rewards": ("reward_model", "reward_pretrain", "remote_rm_url"),
    "data": ("dataset", "prompt_data", "input_key", "label_key", "eval_dataset", "max_samples"),
    "sizes and schedule": (
        "num_agents",
        "max_steps",
        "micro_train_batch_size",
        "gradient_accumulation_steps",
        "ppo_epochs",
        "max_epochs",
        "learning_rate",
        "actor_learning_rate",
        "critic_learning_rate",
        "num_warmup_steps",
        "lr_scheduler",
        "seed",
        "rollout_batch_size",
        "n_samples_per_prompt",
        "generate_max_len",
        "temperature",
        "top_p",
    ),
    "algorithm": (
        "advantage_estimator",
        "init_kl_coef",
        "kl_estimator",
        "use_kl_loss",
        "eps_clip",
        "value_clip",
        "dual_clip",
        "gamma",
        "lambd",
        "entropy_loss_coef",
        "normalize_reward",
    ),
    "strategy and memory": (
        "actor_init_on_gpu",
        "enable_ema",
        "bf16",
        "zero_stage",
        "actor_zero_stage",
        "critic_zero_stage",
        "offload_reference_model",
        "disable_actor_dropout",
        "gradient_checkpointing",
        "use_flash_attn",
    ),
    "vLLM": (
        "vllm_num_engines",
        "vllm_tensor_parallel_size",
        "vllm_gpu_memory_utilization",
        "enable_prefix_caching",
    ),
    "output and logging": (
        "output_dir",
        "logging_steps",
        "save_steps",
        "log_with",
        "wandb_project",
        "wandb_run_name",
    ),
}
"""The launch flags by topic (``marti train --help`` shows one argument group each); every flag of
:data:`FLAG_TABLE` is in exactly one group."""


def flag_help(name: str) -> tuple[str, str]:
    """``(metavar, one-line help)`` of launch flag ``name`` for ``marti train --help``.

    The help names the config keys the flag sets (and the ones it implies) and its note, e.g.
    ``-> strategy.zero_stage, strategy.name=deepspeed``.

    Raises:
        InvalidArgumentError: ``name`` is not a launch flag.
    """
    spec = FLAG_TABLE.get(name)
    if spec is None:
        raise InvalidArgumentError(f"unknown launch flag --{name}")
    metavar = {"switch": "", "models": "M [M ...]", "int": "N", "float": "X", "str": "S"}[spec.kind]
    keys = ", ".join([*spec.keys, *(f"{k}={v}" for k, v in spec.fixed)]) or "no config key"
    text = f"-> {keys}" + (f" ({spec.doc})" if spec.doc else "")
    return metavar, text


@dataclass
class LaunchFlags:
    """Launch flags parsed into config overrides.

    Attributes:
        scalar_overrides: ``key=value`` strings (values JSON-quoted, so they read back as the same YAML value).
        agent_models: Per-agent model lists keyed by agent field (``pretrain_model``, ``critic_model``,
            ``ref_model``), each of length 1 (for all agents) or one per agent.
        warnings: One message per ignored flag, in the order seen.
        num_agents: The value of ``--num_agents``, if given.
    """

    scalar_overrides: list[str] = field(default_factory=list)
    agent_models: dict[str, list[str]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    num_agents: int | None = None
    origins: dict[str, str] = field(default_factory=dict)
    """Config key -> the ``--flag value`` that set it (error messages name the flag, not the file)."""

    def agent_count_hint(self) -> int | None:
        """Number of agents the flags imply: ``--num_agents``, else the longest per-agent model list > 1."""
        if self.num_agents is not None:
            return self.num_agents
        counts = [len(v) for v in self.agent_models.values() if len(v) > 1]
        return max(counts) if counts else None

    def overrides(self, num_agents: int) -> list[str]:
        """All overrides for a team of ``num_agents`` agents: per-agent models first, then scalar flags.

        Raises:
            InvalidArgumentError: A per-agent list has neither 1 nor ``num_agents`` entries.
        """
        out: list[str] = []
        for key, models in self.agent_models.items():
            if len(models) not in (1, num_agents):
                flag = {"pretrain_model": "actor_model"}.get(key, key)
                raise InvalidArgumentError(
                    f"--{flag} gives {len(models)} models but the team has {num_agents} agents "
                    f"(give one model for all or one per agent)"
                )
            for i in range(num_agents):
                out.append(f"agents.{i}.{key}={json.dumps(models[i if len(models) > 1 else 0])}")
        return out + self.scalar_overrides


def _convert(name: str, kind: Kind, raw: str) -> Any:
    try:
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
    except ValueError:
        raise InvalidArgumentError(
            f"--{name} expects {'an integer' if kind == 'int' else 'a number'}, got {raw!r}"
        ) from None
    return raw


def _switch_value(name: str, raw: str | None) -> bool:
    if raw is None:
        return True
    low = raw.lower()
    if low in ("true", "1", "yes"):
        return True
    if low in ("false", "0", "no"):
        return False
    raise InvalidArgumentError(f"--{name} is a switch; '--{name}={raw}' must be true or false")


def _estimator(name: str) -> str:
    """marti's estimator for an ``--advantage_estimator`` value (OpenRLHF's names mapped, marti's kept).

    Raises:
        InvalidArgumentError: neither an OpenRLHF nor a marti estimator (both lists are named).
    """
    ours = ("gae", "grpo", "dr_grpo", "reinforce++", "reinforce++_baseline", "rloo")
    if name in ESTIMATOR_NAMES:
        return ESTIMATOR_NAMES[name]
    if name in ours:
        return name
    raise InvalidArgumentError(
        f"--advantage_estimator {name}: unknown estimator; OpenRLHF's names: {', '.join(ESTIMATOR_NAMES)}; "
        f"marti's: {', '.join(ours)}"
    )


def _split(argv: Sequence[str]) -> list[tuple[str, list[str], bool]]:
    """Group argv into ``(flag, values, had_equals)``; values are the tokens up to the next ``--flag``."""
    groups: list[tuple[str, list[str], bool]] = []
    for tok in argv:
        if tok.startswith("--") and len(tok) > 2:
            name, eq, val = tok[2:].partition("=")
            groups.append((name.replace("-", "_"), [val] if eq else [], bool(eq)))
        elif not groups:
            raise InvalidArgumentError(f"unexpected argument {tok!r} before any --flag")
        else:
            groups[-1][1].append(tok)
    return groups


def parse_launch_flags(argv: Sequence[str], machine: MachineInfo | None = None) -> LaunchFlags:
    """Parse OpenRLHF-style launch flags into config overrides.

    Args:
        argv: Flag tokens, e.g. ``["--actor_model", "A", "B", "--bf16", "--seed=7"]``; ``--a-b`` equals ``--a_b``.
            A repeated flag keeps its last value.
        machine: What this machine supports; None probes it (:meth:`MachineInfo.detect`, which imports torch)
            at the first flag whose effect depends on the machine, and never without such a flag.

    Returns:
        The overrides, per-agent model lists and one warning per ignored flag (a flag given twice is
            reported once); the caller shows them.

    Raises:
        InvalidArgumentError: An unknown flag (named, with the closest known one), a missing or extra value,
            or a value of the wrong type (naming the flag and the value).
    """
    out = LaunchFlags()
    scalars: dict[str, str] = {}
    warned: set[str] = set()
    for name, values, had_eq in _split(argv):
        spec = FLAG_TABLE.get(name)
        if spec is None:
            close = difflib.get_close_matches(name, list(FLAG_TABLE), n=1)
            hint = f" (did you mean --{close[0]}?)" if close else ""
            raise InvalidArgumentError(f"unknown launch flag --{name}{hint}")
        if spec.kind == "switch":
            if len(values) > (1 if had_eq else 0):
                raise InvalidArgumentError(f"--{name} is a switch and takes no value, got {values!r}")
            value: Any = _switch_value(name, values[0] if values else None)
        elif spec.kind == "models":
            if not values or any(not v for v in values):
                raise InvalidArgumentError(f"--{name} needs at least one model name")
            value = list(values)
        else:
            if len(values) != 1:
                raise InvalidArgumentError(f"--{name} takes exactly one value, got {len(values)}: {values!r}")
            value = _convert(name, spec.kind, values[0])
        reason = None
        if spec.unavailable and value is not False:
            machine = (
                MachineInfo.detect() if machine is None else machine
            )  # probed once, when a flag needs it
            reason = spec.unavailable(machine, value)
        if reason is not None:
            if name not in warned:
                warned.add(name)
                msg = f"--{name} ignored: {reason}"
                out.warnings.append(msg)
            continue
        if spec.kind == "models":
            out.agent_models[spec.keys[0].split(".")[-1]] = value
            continue
        if name == "num_agents":
            out.num_agents = value
        if name == "use_flash_attn":
            value = "flash_attention_2" if value else None
        if name == "log_with":
            value = [value]
        if name == "advantage_estimator":
            value = _estimator(value)
        for key in spec.keys:
            scalars[key] = f"{key}={json.dumps(value)}"
            out.origins[key] = f"--{name}" + ("" if spec.kind == "switch" else f" {' '.join(values)}")
        for key, fixed in spec.fixed:
            scalars[key] = f"{key}={json.dumps(fixed)}"
    out.scalar_overrides = list(scalars.values())
    return out


def _base_from_flags(flags: LaunchFlags) -> dict[str, Any]:
    n = flags.agent_count_hint()
    models = flags.agent_models.get("pretrain_model")
    if not models:
        raise InvalidArgumentError(
            "no config file and no --actor_model: give CONFIG.yaml or --actor_model MODEL..."
        )
    n = n or len(models)
    return {
        "training_name": "marti_run",
        "num_agents": n,
        "agents": [
            {
                "name": f"agent_{i + 1}",
                "pretrain_model": models[0],
                "role": DEFAULT_ROLES[i % len(DEFAULT_ROLES)],
            }
            for i in range(n)
        ],
    }


def build_config(
    config_path: str | Path | None,
    overrides: Sequence[str] = (),
    launch_argv: Sequence[str] = (),
    *,
    machine: MachineInfo | None = None,
    unset: Sequence[str] = (),
) -> tuple[TrainConfig, list[str]]:
    """Build the training config of ``marti train`` from a YAML file, launch flags and ``--set`` overrides.

    Precedence, lowest first: the YAML file (or, without one, a team of ``agent_1..N`` built from
    ``--actor_model`` with roles from :data:`DEFAULT_ROLES`) less its ``--unset`` keys, then launch flags, then
    ``--set`` overrides.

    Args:
        config_path: The YAML file, or None to build the team from launch flags alone.
        overrides: Dotted ``KEY=VALUE`` strings (``--set``).
        launch_argv: OpenRLHF-style flag tokens (see :func:`parse_launch_flags`).
        machine: What this machine supports; None probes it when a flag needs it (:func:`parse_launch_flags`).
        unset: Dotted keys dropped from the file (``--unset``, :func:`marti.config.unset_keys`); a launch flag or
            ``--set`` that sets one of them too is refused.

    Returns:
        ``(config, warnings)``: the validated config and one message per ignored launch flag.

    Raises:
        InvalidArgumentError: Unreadable or invalid YAML, an unknown flag or key, or flags that disagree with
            the file on the number of agents (naming both numbers).
    """
    flags = parse_launch_flags(launch_argv, machine)
    if config_path is None:
        raw, source = _base_from_flags(flags), "<launch flags>"
    else:
        source = str(config_path)
        try:
            raw = load_yaml(Path(config_path).read_text(encoding="utf-8"), source) or {}
        except OSError as exc:
            raise InvalidArgumentError(f"cannot read config file {source!r}: {exc.strerror or exc}") from None
        except yaml.YAMLError as exc:
            raise InvalidArgumentError(f"{source}: not valid YAML: {yaml_error_line(exc)}") from None
        if not isinstance(raw, dict):
            raise InvalidArgumentError(f"{source}: the config must be a YAML mapping")
    agents = raw.get("agents")
    n_file = len(agents) if isinstance(agents, list) else 0
    hint = flags.agent_count_hint()
    if hint is not None and n_file and hint != n_file:
        raise InvalidArgumentError(f"launch flags describe {hint} agents but {source} lists {n_file}")
    raw = unset_keys(raw, unset, [*flags.overrides(n_file or hint or 0), *overrides])
    notes = list(flags.warnings)
    estimator = _chosen_estimator(flags, overrides, raw, config_path is not None)
    flags = _without_critic_flags(flags, estimator, notes)
    if config_path is None:
        raw = apply_overrides(raw, _openrlhf_defaults(flags, notes, estimator))
    raw = apply_overrides(raw, flags.overrides(n_file or hint or 0))
    try:
        cfg = config_from_dict(raw, overrides, source=source)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(
            _blame_flags(str(exc), source, flags.origins)
            + _dataset_env_hint(str(exc), flags.origins)
            + _group_size_hint(str(exc), flags.origins, config_path is None),
            metadata=exc.metadata,
        ) from None
    notes += _unused_vllm_flags(cfg, flags.origins, source, overrides)
    return cfg, notes


def _unused_vllm_flags(
    cfg: TrainConfig, origins: dict[str, str], source: str, overrides: Sequence[str]
) -> list[str]:
    """One note per ``vllm.*`` launch flag that no engine reads: the config's ``rollout.engine`` is a
    transformers engine (``hf`` or ``hf_static``; ``auto`` may pick vLLM on a CUDA machine, ``vllm`` reads them)."""
    if cfg.rollout.engine in ("vllm", "auto"):
        return []
    setter = "--set" if any(o.startswith("rollout.engine=") for o in overrides) else source
    return [
        f"{flag.split()[0]} unused: rollout.engine is {cfg.rollout.engine} (from {setter}), "
        "and only the vllm engine (or auto, where it picks vLLM) reads vllm.*"
        for key, flag in origins.items()
        if key.startswith("vllm.")
    ]


#: Config keys only the critic reads (``gae``): the OpenRLHF defaults among them apply, and the launch flags setting
#: them are applied, only where the estimator is ``gae`` (the config refuses critic settings another estimator
#: would not read, :mod:`marti.config.unread`).
_CRITIC_KEYS = (*(f"algorithm.{k}" for k in CRITIC_ALGORITHM_KEYS), "strategy.critic_zero_stage")


def _chosen_estimator(
    flags: LaunchFlags, overrides: Sequence[str], raw: dict[str, Any], has_file: bool
) -> str:
    """The advantage estimator the job will use: the last of ``--set`` and ``--advantage_estimator``, else the
    config file's (marti's default ``grpo`` where it names none), else with no file OpenRLHF's ``gae``."""
    algorithm = raw.get("algorithm") if isinstance(raw.get("algorithm"), dict) else {}
    est = algorithm.get("advantage_estimator", AlgorithmConfig.model_fields["advantage_estimator"].default)
    if not has_file:
        est = OPENRLHF_DEFAULTS["algorithm.advantage_estimator"][1]
    for item in [*flags.scalar_overrides, *overrides]:
        key, _, value = item.partition("=")
        if key.strip() == "algorithm.advantage_estimator":
            est = load_yaml(value, "override")
    return str(est)


def _without_critic_flags(flags: LaunchFlags, estimator: str, notes: list[str]) -> LaunchFlags:
    """``flags`` less the critic's (``--critic_model``, ``--critic_learning_rate``, ``--critic_zero_stage``,
    ``--lambd``, ``--value_clip``) where ``estimator`` trains no critic, with one note per flag; else ``flags``."""
    given = [flags.origins[k] for k in _CRITIC_KEYS if k in flags.origins]
    if "critic_model" in flags.agent_models:
        given.insert(0, "--critic_model")
    if estimator == "gae" or not given:
        return flags
    notes += [
        f"{flag} ignored: algorithm.advantage_estimator is {estimator}, which trains no critic "
        "(only gae does, OpenRLHF's default)"
        for flag in given
    ]
    drop = set(_CRITIC_KEYS)
    if "strategy.zero_stage" not in flags.origins:
        drop.add("strategy.name")  # deepspeed came from --critic_zero_stage alone
    return dataclasses.replace(
        flags,
        scalar_overrides=[o for o in flags.scalar_overrides if o.partition("=")[0] not in drop],
        agent_models={k: v for k, v in flags.agent_models.items() if k != "critic_model"},
        origins={k: v for k, v in flags.origins.items() if k not in drop},
    )


def _openrlhf_defaults(flags: LaunchFlags, notes: list[str], estimator: str) -> list[str]:
    """Overrides setting :data:`OPENRLHF_DEFAULTS` for the keys no flag sets (the critic's only where
    ``estimator`` is ``gae``); appends one note saying so."""
    unset = {
        k: v
        for k, v in OPENRLHF_DEFAULTS.items()
        if k not in flags.origins and (estimator == "gae" or k not in _CRITIC_KEYS)
    }
    if unset:
        shown = ", ".join(f"--{flag} {str(value).lower()}" for flag, value in unset.values())
        notes.append(
            f"no config file: OpenRLHF's defaults apply ({shown}: PPO with a critic per agent unless "
            "--advantage_estimator says otherwise); marti's defaults apply to every other key (docs/config.md)"
        )
    return [f"{k}={json.dumps(v)}" for k, (_flag, v) in unset.items()]


def _blame_flags(message: str, source: str, origins: dict[str, str]) -> str:
    """Rewrite each ``SOURCE: 'key': problem`` line of a config error whose key a launch flag set as
    ``--flag value: 'key': problem`` (the value came from the flag, not from the file)."""
    lines = []
    for line in message.splitlines():
        for key, flag in origins.items():
            if line.startswith(f"{source}: '{key}':"):
                line = flag + line[len(source) :]
                break
        lines.append(line)
    return "\n".join(lines)


def _dataset_env_hint(message: str, origins: dict[str, str]) -> str:
    """A line naming the flag that set ``dataset.path`` when the config refused the file's env for it (a YAML
    naming a scenario env, e.g. the design's ``collaborative_task_solving``, run with ``--dataset``): the file's
    env is not switched behind its back; the line says how to switch it. Empty otherwise."""
    flag = origins.get("dataset.path")
    if flag is None or "dataset rows are played by" not in message:
        return ""
    return (
        f"\n{flag} sets dataset.path, whose rows the config file's environment.env_name cannot play: remove "
        f"env_name from the file or add --set environment.env_name={DATASET_ENV}"
    )


def _group_size_hint(message: str, origins: dict[str, str], no_file: bool) -> str:
    """A line naming ``--n_samples_per_prompt`` when the config refused a group estimator's group size that no
    flag set and OpenRLHF's default (1, no config file) gave. Empty otherwise."""
    if not no_file or "rollout.group_size" in origins or "needs rollout.group_size >= 2" not in message:
        return ""
    return (
        "\nrollout.group_size is OpenRLHF's default --n_samples_per_prompt 1 (no config file): give "
        "--n_samples_per_prompt N with N >= 2 for a group estimator"
    )


def flag_table_markdown() -> str:
    """The launch flag table of ``docs/config.md``: flag, config keys it sets, notes."""
    rows = ["| flag | config key(s) | notes |", "| --- | --- | --- |"]
    for name, spec in FLAG_TABLE.items():
        keys = ", ".join(f"`{k}`" for k in spec.keys) or "(none)"
        if spec.fixed:
            keys += ", " + ", ".join(f"`{k}={v}`" for k, v in spec.fixed)
        arg = {"switch": "", "models": " M1 [M2 ...]", "int": " N", "float": " X", "str": " S"}[spec.kind]
        rows.append(f"| `--{name}{arg}` | {keys} | {spec.doc} |")
    return "\n".join(rows)
