"""Exponential moving average of a policy's trained weights (``policy.ema``, OpenRLHF's ``--enable_ema``).

After every optimizer step each tracked parameter's shadow copy becomes
``ema = beta * ema + (1 - beta) * param`` (OpenRLHF ``moving_average``, beta ``policy.ema_beta``, 0.992 by
default), starting from the initial weights. Only trainable parameters are tracked (a LoRA adapter, or the
whole model in ``per_agent`` / ``shared`` mode). Evaluation runs with the average
(:meth:`services.trainer.ray.policy_worker.PolicyWorker.generate` with ``greedy``) and checkpoints save it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping

import torch

from marti.errors import InvalidArgumentError

__all__ = ["EmaWeights"]


class EmaWeights:
    """Shadow copies of some parameters, moved towards them by :meth:`update`.

    Args:
        named_params: ``(name, parameter)`` pairs to track (the live parameters; kept by reference). The
            averages start as detached fp32 copies of their current values.
        beta: Decay in (0, 1): the weight of the old average in each update.

    Raises:
        InvalidArgumentError: ``beta`` outside (0, 1), no parameters, or a repeated name.
    """

    def __init__(self, named_params: Iterable[tuple[str, torch.nn.Parameter]], beta: float) -> None:
        if not 0.0 < beta < 1.0:
            raise InvalidArgumentError(f"policy.ema_beta must be in (0, 1), got {beta}")
        self.beta = float(beta)
        self._params: dict[str, torch.nn.Parameter] = {}
        for name, p in named_params:
            if name in self._params:
                raise InvalidArgumentError(f"EMA parameter name {name!r} is repeated")
            self._params[name] = p
        if not self._params:
            raise InvalidArgumentError("EMA needs at least one trainable parameter, got none")
        self.shadow: dict[str, torch.Tensor] = {
            n: p.detach().to(torch.float32).clone() for n, p in self._params.items()
        }
        self.updates = 0

    @torch.no_grad()
    def update(self) -> None:
        """One EMA step after an optimizer step: ``ema = beta * ema + (1 - beta) * param`` for every parameter."""
        for name, p in self._params.items():
            self.shadow[name].mul_(self.beta).add_(p.detach().to(torch.float32), alpha=1.0 - self.beta)
        self.updates += 1

    @torch.no_grad()
    def swap_in(self) -> dict[str, torch.Tensor]:
        """Write the averages into the tracked parameters; returns their own values, for :meth:`restore`."""
        saved = {n: p.detach().clone() for n, p in self._params.items()}
        for name, p in self._params.items():
            p.copy_(self.shadow[name].to(p.dtype))
        return saved

    @torch.no_grad()
    def restore(self, saved: Mapping[str, torch.Tensor]) -> None:
        """Put back the values :meth:`swap_in` returned."""
        for name, p in self._params.items():
            p.copy_(saved[name])

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """Within the block the tracked parameters hold the averages; on exit their own values come back."""
        saved = self.swap_in()
        try:
            yield
        finally:
            self.restore(saved)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The averages by parameter name (CPU fp32 copies), plus nothing else: ``{name: (shape) tensor}``."""
        return {n: t.detach().cpu().clone() for n, t in self.shadow.items()}

    @torch.no_grad()
    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """Restore averages saved by :meth:`state_dict`.

        Raises:
            InvalidArgumentError: the names or shapes differ from the tracked parameters (named).
        """
        if set(state) != set(self.shadow):
            missing = sorted(set(self.shadow) - set(state))[:3]
            extra = sorted(set(state) - set(self.shadow))[:3]
            raise InvalidArgumentError(
                f"EMA state does not match the model: missing {missing}, unexpected {extra}"
            )
        for name, t in state.items():
            if tuple(t.shape) != tuple(self.shadow[name].shape):
                raise InvalidArgumentError(
                    f"EMA state {name!r} has shape {tuple(t.shape)}, the model {tuple(self.shadow[name].shape)}"
                )
            self.shadow[name].copy_(t.to(self.shadow[name].device, torch.float32))
