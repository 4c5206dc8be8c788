"""Plain-torch training strategy: AdamW, LambdaLR cosine schedule, accumulation, clipping, bf16 autocast.

Checkpoint folder written by :meth:`TorchTrainEngine.save_checkpoint`::

    weights.safetensors   the trained parameters by name (only those passed to ``setup``)
    grads.safetensors     accumulated gradients, only when saved inside an accumulation window
    optimizer.pt          optimizer state dict
    scheduler.pt          LR scheduler state dict
    rng.pt                python, numpy, torch (CPU, CUDA) RNG states
    state.json            {"global_step", "micro_step", "data_position"}

Resuming from it is exact: continuing training gives bit-identical parameters to an uninterrupted run on CPU
(tested in ``tests/unit/trainer/strategy/test_strategy.py``).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from marti.errors import InvalidArgumentError, NotFoundError
from services.trainer.job.run.checkpoint import load_rng_state, save_rng_state, write_json_atomic
from services.trainer.strategy import frozen_bf16
from services.trainer.strategy.base import (
    OptimConfig,
    StepResult,
    Strategy,
    TrainEngine,
    apply_configured_hyperparams,
    make_optimizer,
    make_scheduler,
    resolve_bf16,
)


class TorchTrainEngine(TrainEngine):
    """A :class:`TrainEngine` on plain torch (any device, one process).

    With bf16 on the CPU, ``model``'s frozen linears (a LoRA base) multiply with cached bf16 copies of their
    weights inside autocast instead of a cast per forward (:mod:`~services.trainer.strategy.frozen_bf16`: the same
    numbers, plus 2 bytes per frozen linear weight element).

    Args:
        model: The module that owns ``params``.
        params: Trainable parameters (all must belong to ``model``).
        cfg: Optimizer and schedule settings.
    """

    def __init__(
        self, model: torch.nn.Module, params: Iterable[torch.nn.Parameter], cfg: OptimConfig
    ) -> None:
        self.model = model
        self.cfg = cfg
        plist = list(params)
        ids = {id(p) for p in plist}
        self._names = {id(p): n for n, p in model.named_parameters(remove_duplicate=True) if id(p) in ids}
        if len(self._names) != len(ids):
            raise InvalidArgumentError(
                f"{len(ids) - len(self._names)} of the given parameters are not in the model"
            )
        self.params = plist
        self.optimizer = make_optimizer(plist, cfg)
        self.scheduler = make_scheduler(self.optimizer, cfg)
        device = plist[0].device
        self.bf16 = resolve_bf16(cfg.bf16, device)
        self._device_type = device.type
        if self.bf16 and device.type == "cpu":  # frozen linears (a LoRA base) cast once, not per forward
            frozen_bf16.install(model)
        self.global_step = 0
        self.micro_step = 0

    @property
    def lr(self) -> float:
        """Learning rate the next optimizer step uses."""
        return float(self.optimizer.param_groups[0]["lr"])

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """bf16 autocast on the parameters' device when enabled, else a no-op."""
        if self.bf16:
            return torch.autocast(device_type=self._device_type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        """Back-propagate ``loss / grad_accum_steps``.

        Raises:
            InvalidArgumentError: ``loss`` is not a scalar tensor.
        """
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise InvalidArgumentError(
                f"loss must be a scalar tensor, got {getattr(loss, 'shape', type(loss))}"
            )
        (loss / self.cfg.grad_accum_steps).backward()

    def step(self) -> StepResult:
        """See :meth:`TrainEngine.step`. A non-finite gradient norm skips the update (reported)."""
        boundary = self.at_boundary
        self.micro_step += 1
        if not boundary:
            return StepResult(stepped=False, grad_norm=None, lr=self.lr)
        max_norm = self.cfg.max_grad_norm if self.cfg.max_grad_norm is not None else float("inf")
        norm = float(torch.nn.utils.clip_grad_norm_(self.params, max_norm))
        lr = self.lr
        if not torch.isfinite(torch.tensor(norm)):
            self.optimizer.zero_grad(set_to_none=True)
            return StepResult(stepped=False, grad_norm=norm, lr=lr, skipped_nonfinite=True)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.global_step += 1
        self.run_step_hooks()
        return StepResult(stepped=True, grad_norm=norm, lr=lr)

    def save_checkpoint(self, path: str | Path, data_position: Mapping[str, Any] | None = None) -> None:
        """See :meth:`TrainEngine.save_checkpoint` (layout in the module docstring)."""
        from safetensors.torch import save_file

        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        weights = {self._names[id(p)]: p.detach().cpu().contiguous() for p in self.params}
        save_file(weights, str(root / "weights.safetensors"))
        grads = {
            self._names[id(p)]: p.grad.detach().cpu().contiguous() for p in self.params if p.grad is not None
        }
        (root / "grads.safetensors").unlink(missing_ok=True)
        if grads:  # saved mid accumulation window: keep the partial sum so resume is exact
            save_file(grads, str(root / "grads.safetensors"))
        torch.save(self.optimizer.state_dict(), root / "optimizer.pt")
        torch.save(self.scheduler.state_dict(), root / "scheduler.pt")
        save_rng_state(root / "rng.pt")
        write_json_atomic(
            root / "state.json",
            {
                "global_step": self.global_step,
                "micro_step": self.micro_step,
                "data_position": dict(data_position or {}),
            },
        )

    def load_checkpoint(self, path: str | Path, *, restore_rng: bool = True) -> dict[str, Any]:
        """See :meth:`TrainEngine.load_checkpoint`.

        Raises:
            NotFoundError: A checkpoint file is missing.
            InvalidArgumentError: The saved weights do not match this engine's parameters (name or shape).
        """
        from safetensors.torch import load_file

        root = Path(path)
        for f in ("weights.safetensors", "optimizer.pt", "scheduler.pt", "rng.pt", "state.json"):
            if not (root / f).is_file():
                raise NotFoundError(f"checkpoint {root} is missing {f}")
        weights = load_file(str(root / "weights.safetensors"))
        expected = {self._names[id(p)]: p for p in self.params}
        if set(weights) != set(expected):
            diff = sorted(set(weights) ^ set(expected))
            raise InvalidArgumentError(
                f"checkpoint weights differ from the engine's parameters, e.g. {diff[:3]}"
            )
        with torch.no_grad():
            for name, p in expected.items():
                if tuple(weights[name].shape) != tuple(p.shape):
                    raise InvalidArgumentError(
                        f"checkpoint weight {name!r} has shape {tuple(weights[name].shape)}, expected {tuple(p.shape)}"
                    )
                p.copy_(weights[name].to(p.device, p.dtype))
        grads = load_file(str(root / "grads.safetensors")) if (root / "grads.safetensors").is_file() else {}
        for name, p in expected.items():
            p.grad = grads[name].to(p.device, p.dtype) if name in grads else None
        self.optimizer.load_state_dict(torch.load(root / "optimizer.pt", weights_only=True))
        self.scheduler.load_state_dict(torch.load(root / "scheduler.pt", weights_only=True))
        apply_configured_hyperparams(self.optimizer, self.scheduler, self.cfg)  # a resume may change them
        state = json.loads((root / "state.json").read_text())
        self.global_step, self.micro_step = int(state["global_step"]), int(state["micro_step"])
        if restore_rng:
            load_rng_state(root / "rng.pt")
        return dict(state["data_position"])


class TorchStrategy(Strategy):
    """Plain torch in one process: ``setup`` returns a :class:`TorchTrainEngine`."""

    def setup(
        self, model: torch.nn.Module, params: Iterable[torch.nn.Parameter], cfg: OptimConfig
    ) -> TorchTrainEngine:
        """Build the engine (AdamW + cosine LambdaLR) for ``params`` of ``model``."""
        return TorchTrainEngine(model, params, cfg)
