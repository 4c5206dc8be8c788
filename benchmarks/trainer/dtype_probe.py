"""What dtypes an arm of ``marti bench trainer`` really computed in, per phase (generation, update).

Standard library and torch only: the TRL runner (:mod:`trl_runner`, TRL's own virtualenv, no ``marti``)
imports it as well as our side (:mod:`benchmarks.trainer.ours`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class DtypeProbe:
    """Records the dtypes of every ``torch.nn.Linear`` call in the process while on, by phase.

    A global module forward hook (:func:`torch.nn.modules.module.register_module_forward_hook`) sees each
    linear layer's output dtype (what the matrix product computed in: bf16 under autocast or with bf16
    weights) and its weight dtype, filed under :attr:`current` (set by :meth:`phase`, or directly by a caller
    whose phase spans callbacks); calls while it is None are not recorded. The hook slows every module call a little, so a bench keeps it on for one step only
    (:meth:`stop`).

    Example::

        probe = DtypeProbe()
        with probe.phase("generation"):
            model.generate(...)
        probe.stop()
        probe.report()  # {"generation": {"compute": ["bfloat16"], "weights": ["bfloat16"]}}
    """

    def __init__(self) -> None:
        import torch

        self._linear = torch.nn.Linear
        self.current: str | None = None
        """The phase linear calls are filed under now; None: not recorded."""
        self._seen: dict[str, dict[str, set[str]]] = {}
        self._handle: Any = torch.nn.modules.module.register_module_forward_hook(self._hook)

    def _hook(self, module: Any, inputs: Any, output: Any) -> None:
        """Forward hook: file the output and weight dtypes of a linear layer under the current phase."""
        if self.current is None or not isinstance(module, self._linear) or not hasattr(output, "dtype"):
            return
        entry = self._seen.setdefault(self.current, {"compute": set(), "weights": set()})
        entry["compute"].add(str(output.dtype).removeprefix("torch."))
        entry["weights"].add(str(module.weight.dtype).removeprefix("torch."))

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """File the linear calls made inside the block under ``name`` (restores the outer phase after)."""
        outer, self.current = self.current, name
        try:
            yield
        finally:
            self.current = outer

    def stop(self) -> None:
        """Remove the hook (idempotent); what was recorded stays in :meth:`report`."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def report(self) -> dict[str, dict[str, list[str]]]:
        """``{phase: {"compute": sorted output dtypes, "weights": sorted weight dtypes}}``, e.g. ``"bfloat16"``."""
        return {p: {k: sorted(v) for k, v in e.items()} for p, e in sorted(self._seen.items())}
