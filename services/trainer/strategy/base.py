"""The training-strategy interface: optimizer config, LR schedule, and the per-unit training engine.

A strategy (:class:`TorchStrategy`, :class:`DeepSpeedStrategy`) turns ``(model, params, OptimConfig)`` into a
:class:`TrainEngine`, one per trainable unit (an agent, or the shared model). The loop then calls, per micro
batch, ``with engine.autocast(): loss = ...``, ``engine.backward(loss)``, ``engine.step()``; every
``grad_accum_steps`` micro steps the engine clips gradients, steps the optimizer and the LR scheduler, and zeroes
gradients. ``engine.backward`` divides the loss by ``grad_accum_steps`` so accumulated gradients equal the
gradient of the mean loss over the micro batches.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from marti.errors import InvalidArgumentError
from marti.plumbing.cpu_features import CPUINFO, cpu_has_bf16

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OptimConfig:
    """Optimizer, schedule, accumulation and precision settings of one training unit.

    Attributes:
        lr: Peak learning rate, > 0.
        weight_decay: AdamW decoupled weight decay, >= 0.
        betas: AdamW betas, each in [0, 1).
        eps: AdamW epsilon, > 0.
        max_grad_norm: Clip the global L2 norm of the gradients to this (> 0); None disables clipping (the norm
            is still measured and reported).
        grad_accum_steps: Micro steps per optimizer step, >= 1.
        total_steps: Optimizer steps of the whole run, >= 1 (the cosine decays over it).
        warmup_steps: Linear warmup optimizer steps; when None, ``round(warmup_ratio * total_steps)``.
        warmup_ratio: Fraction of ``total_steps`` used for warmup, in [0, 1].
        lr_scheduler: ``cosine`` (warmup then cosine to ``min_lr_ratio * lr``), ``linear`` (warmup then linear
            decay to ``min_lr_ratio * lr``) or ``constant`` (warmup then flat).
        min_lr_ratio: Floor of the cosine or linear decay as a fraction of ``lr``, in [0, 1].
        bf16: True: bf16 autocast (and bf16 weights under DeepSpeed); False: fp32; None: bf16 where the device
            supports it (CUDA with bf16), else fp32.
    """

    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    max_grad_norm: float | None = 1.0
    grad_accum_steps: int = 1
    total_steps: int = 1000
    warmup_steps: int | None = None
    warmup_ratio: float = 0.0
    lr_scheduler: Literal["cosine", "linear", "constant"] = "cosine"
    min_lr_ratio: float = 0.0
    bf16: bool | None = None

    def __post_init__(self) -> None:
        """Validate every field; raises InvalidArgumentError naming the field, value and limit."""
        checks = [
            ("lr", self.lr > 0, "> 0"),
            ("weight_decay", self.weight_decay >= 0, ">= 0"),
            ("betas", all(0 <= b < 1 for b in self.betas) and len(self.betas) == 2, "two values in [0, 1)"),
            ("eps", self.eps > 0, "> 0"),
            ("max_grad_norm", self.max_grad_norm is None or self.max_grad_norm > 0, "> 0 or None"),
            (
                "grad_accum_steps",
                isinstance(self.grad_accum_steps, int) and self.grad_accum_steps >= 1,
                "an int >= 1",
            ),
            ("total_steps", isinstance(self.total_steps, int) and self.total_steps >= 1, "an int >= 1"),
            (
                "warmup_steps",
                self.warmup_steps is None or 0 <= self.warmup_steps <= self.total_steps,
                "in [0, total_steps]",
            ),
            ("warmup_ratio", 0 <= self.warmup_ratio <= 1, "in [0, 1]"),
            (
                "lr_scheduler",
                self.lr_scheduler in ("cosine", "linear", "constant"),
                "'cosine', 'linear' or 'constant'",
            ),
            ("min_lr_ratio", 0 <= self.min_lr_ratio <= 1, "in [0, 1]"),
        ]
        for name, ok, limit in checks:
            if not ok:
                raise InvalidArgumentError(f"OptimConfig.{name} must be {limit}, got {getattr(self, name)!r}")

    @property
    def num_warmup_steps(self) -> int:
        """Warmup length in optimizer steps."""
        return (
            self.warmup_steps
            if self.warmup_steps is not None
            else round(self.warmup_ratio * self.total_steps)
        )


def lr_multiplier(step: int, cfg: OptimConfig) -> float:
    """LR multiplier for optimizer step ``step`` (0-based): linear warmup, then cosine, linear or constant.

    Formulas (transformers ``get_cosine_schedule_with_warmup`` and ``get_linear_schedule_with_warmup``, with a
    floor ``m = min_lr_ratio``): ``step < W: step / W``; else ``p = (step - W) / max(1, S - W)`` clipped to
    [0, 1] and cosine ``m + (1 - m) * 0.5 * (1 + cos(pi * p))``, linear ``m + (1 - m) * (1 - p)``, where
    W = warmup steps and S = total steps.
    """
    warmup = cfg.num_warmup_steps
    if step < warmup:
        return step / warmup
    if cfg.lr_scheduler == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, cfg.total_steps - warmup))
    if cfg.lr_scheduler == "linear":
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * (1.0 - progress)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def apply_configured_hyperparams(
    optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler, cfg: OptimConfig
) -> None:
    """Put ``cfg``'s learning rate, betas, eps and weight decay back after a checkpoint's optimizer and scheduler
    states were loaded (they carry the hyperparameters of the run that saved them).

    A resumed job (``marti train --resume --set learning_rate=...``) thus trains at the configured rate: each
    group's base rate becomes ``cfg.lr`` and its current rate ``cfg.lr * lr_multiplier(last_epoch, cfg)``; the
    moments (Adam's ``exp_avg``, ``exp_avg_sq``) and the schedule position are kept.
    """
    groups = optimizer.param_groups
    scheduler.base_lrs = [cfg.lr] * len(groups)
    for group in groups:
        group["initial_lr"] = cfg.lr
        group["lr"] = cfg.lr * lr_multiplier(scheduler.last_epoch, cfg)
        group["betas"], group["eps"], group["weight_decay"] = tuple(cfg.betas), cfg.eps, cfg.weight_decay
    scheduler._last_lr = [g["lr"] for g in groups]  # what get_last_lr() reports


def make_optimizer(params: Iterable[torch.nn.Parameter], cfg: OptimConfig) -> torch.optim.AdamW:
    """A plain ``torch.optim.AdamW`` (no JIT-built kernels) over ``params``.

    Raises:
        InvalidArgumentError: ``params`` is empty or holds a parameter without ``requires_grad``.
    """
    plist = list(params)
    if not plist:
        raise InvalidArgumentError("no trainable parameters given to the optimizer")
    frozen = [i for i, p in enumerate(plist) if not p.requires_grad]
    if frozen:
        raise InvalidArgumentError(
            f"parameter {frozen[0]} does not require grad; pass trainable parameters only"
        )
    return torch.optim.AdamW(plist, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)


def make_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """``LambdaLR`` applying :func:`lr_multiplier` (the first step runs at multiplier ``lr_multiplier(0)``)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_multiplier(s, cfg))


def resolve_bf16(flag: bool | None, device: torch.device, cpuinfo: Path = CPUINFO) -> bool:
    """Decide bf16: an explicit flag wins; None means CUDA with bf16 support.

    An explicit True on a CPU without native bf16 (:func:`marti.plumbing.cpu_features.cpu_has_bf16` false for ``cpuinfo``)
    is kept, but logs a warning naming ``strategy.bf16``: the bf16 arithmetic is emulated there, slower than fp32.
    """
    if flag is not None:
        if flag and device.type == "cpu" and not cpu_has_bf16(cpuinfo):
            log.warning(
                "strategy.bf16=true on a CPU without native bf16 (no avx512_bf16 or amx_bf16 in %s): bf16 is "
                "emulated there and trains slower than fp32; set strategy.bf16: false",
                cpuinfo,
            )
        return flag
    return device.type == "cuda" and torch.cuda.is_bf16_supported()


@dataclass
class StepResult:
    """What one ``engine.step()`` did.

    Attributes:
        stepped: True when this micro step ended an accumulation window and the optimizer ran.
        grad_norm: Global gradient L2 norm before clipping (optimizer steps only).
        lr: Learning rate used by this optimizer step (the current one otherwise).
        skipped_nonfinite: The gradient norm was NaN or inf, so the update was skipped (gradients zeroed).
    """

    stepped: bool
    grad_norm: float | None
    lr: float
    skipped_nonfinite: bool = False


class TrainEngine(abc.ABC):
    """One trainable unit under a strategy: forward precision, backward, accumulation, steps, checkpoints.

    Attributes:
        model: The module being trained (forward through it, or through the policy that owns it).
        global_step: Optimizer steps taken.
        micro_step: Micro steps taken (backward calls followed by ``step``).
    """

    model: torch.nn.Module
    cfg: OptimConfig
    global_step: int = 0
    micro_step: int = 0

    @abc.abstractmethod
    def backward(self, loss: torch.Tensor) -> None:
        """Back-propagate ``loss / grad_accum_steps`` (a scalar tensor)."""

    @abc.abstractmethod
    def step(self) -> StepResult:
        """End a micro step; at an accumulation boundary clip, step the optimizer and the scheduler."""

    @abc.abstractmethod
    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Context for forward passes: bf16 autocast when enabled, else a no-op."""

    @abc.abstractmethod
    def save_checkpoint(self, path: str | Path, data_position: Mapping[str, Any] | None = None) -> None:
        """Write model (trainable weights), optimizer, scheduler, counters, RNG and ``data_position``."""

    @abc.abstractmethod
    def load_checkpoint(self, path: str | Path, *, restore_rng: bool = True) -> dict[str, Any]:
        """Restore what :meth:`save_checkpoint` wrote; returns the saved ``data_position``."""

    @property
    @abc.abstractmethod
    def lr(self) -> float:
        """Current learning rate."""

    @contextlib.contextmanager
    def gathered(self, modify: bool = False) -> Iterator[None]:
        """Context in which every parameter is whole (ZeRO-3 gathers partitions); read weights for sync here.

        Args:
            modify: Keep in-place writes to the parameters made inside the block (ZeRO-3 re-partitions them on
                exit); False discards them there, which is cheaper.
        """
        yield

    def add_step_hook(self, hook: Callable[[], None]) -> None:
        """Call ``hook()`` after every optimizer step that updated the weights (not after skipped or
        accumulation-only micro steps); e.g. :meth:`services.trainer.learn.ema.EmaWeights.update` (``policy.ema``)."""
        self.__dict__.setdefault("_step_hooks", []).append(hook)

    def run_step_hooks(self) -> None:
        """Run the :meth:`add_step_hook` hooks, in the order added (engines call it after an optimizer step)."""
        for hook in self.__dict__.get("_step_hooks", ()):
            hook()

    @property
    def at_boundary(self) -> bool:
        """True when the next ``step()`` will run the optimizer."""
        return (self.micro_step + 1) % self.cfg.grad_accum_steps == 0


class Strategy(abc.ABC):
    """Builds :class:`TrainEngine` objects."""

    @abc.abstractmethod
    def setup(
        self, model: torch.nn.Module, params: Iterable[torch.nn.Parameter], cfg: OptimConfig
    ) -> TrainEngine:
        """Wrap ``model`` for training of ``params`` (a subset of its parameters) under ``cfg``."""
