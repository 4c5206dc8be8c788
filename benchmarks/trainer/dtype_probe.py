"""What dtypes an arm of ``marti bench trainer`` really computed in, per phase (generation, update).

Standard library and torch only: the TRL runner (:mod:`trl_runner`, TRL's own virtualenv, no ``marti``)
imports it as well as our side (:mod:`benchmarks.trainer.ours`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

BARE_PRODUCT_PHASES = ("generation", "update")
"""Phases in which :class:`DtypeProbe` also records matrix products made outside a linear layer's call."""


class DtypeProbe:
    """Records the dtypes of every linear product in the process while on, by phase.

    A global module forward hook (:func:`torch.nn.modules.module.register_module_forward_hook`) sees each
    ``torch.nn.Linear`` layer's output dtype (what the matrix product computed in: bf16 under autocast or with bf16
    weights) and its weight dtype. In the phases of :data:`BARE_PRODUCT_PHASES` (generation), products computed
    without a linear module (our rollout engine's lean forward multiplies with fused or oneDNN-packed weights:
    ``aten.mm`` / ``aten.addmm`` / ``mkldnn._linear_pointwise`` outside any linear layer's call) are seen too, by a
    dispatch mode (``TorchDispatchMode``), with the product's output dtype and its weight operand's dtype, in the
    thread that made the probe only (dispatch modes are thread-local; our bench generates in that thread, an engine
    pool's or an asynchronous producer's threads would go unseen). In the update, our lean training forward
    multiplies without linear layers too (:mod:`services.trainer.models.lean_training`); there only products made
    with gradients recorded are the forward's (backward products and weight merges run without), and only their
    output dtype is filed: their operands are cast or fused copies, so the weights the update holds are filed by the
    caller (:meth:`record_weights`). Records
    are filed under :attr:`current` (set by :meth:`phase`, or directly by a caller whose phase spans callbacks);
    calls while it is None are not recorded. The hooks and the mode slow every call a little, so a bench keeps them
    on for one step only (:meth:`stop`).

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
        self._inside_linear = 0
        self._handles: list[Any] = [
            torch.nn.modules.module.register_module_forward_pre_hook(self._enter),
            torch.nn.modules.module.register_module_forward_hook(self._hook),
        ]
        self._mode: Any = _products_mode(self)
        self._mode.__enter__()

    def _enter(self, module: Any, inputs: Any) -> None:
        """Forward pre-hook: products inside a linear layer's call are the layer's (filed by :meth:`_hook`)."""
        if isinstance(module, self._linear):
            self._inside_linear += 1

    def _hook(self, module: Any, inputs: Any, output: Any) -> None:
        """Forward hook: file the output and weight dtypes of a linear layer under the current phase."""
        if not isinstance(module, self._linear):
            return
        self._inside_linear -= 1
        if self.current is not None and hasattr(output, "dtype"):
            self.record(output.dtype, module.weight.dtype)

    def record(self, compute: Any, weights: Any) -> None:
        """File one product's output and weight dtypes (``weights`` None: the output's only) under the current phase
        (nothing when there is none)."""
        if self.current is None:
            return
        entry = self._seen.setdefault(self.current, {"compute": set(), "weights": set()})
        entry["compute"].add(str(compute).removeprefix("torch."))
        if weights is not None:
            entry["weights"].add(str(weights).removeprefix("torch."))

    def record_weights(self, model: Any) -> None:
        """File the weight dtypes of ``model``'s linear layers under the current phase (for products made from
        copies of them, which the dispatch mode files without weights)."""
        if self.current is None:
            return
        entry = self._seen.setdefault(self.current, {"compute": set(), "weights": set()})
        for module in model.modules():
            if isinstance(module, self._linear):
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
        """Remove the hooks and the dispatch mode (idempotent); what was recorded stays in :meth:`report`."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None

    def report(self) -> dict[str, dict[str, list[str]]]:
        """``{phase: {"compute": sorted output dtypes, "weights": sorted weight dtypes}}``, e.g. ``"bfloat16"``."""
        return {p: {k: sorted(v) for k, v in e.items()} for p, e in sorted(self._seen.items())}


def _products_mode(probe: DtypeProbe) -> Any:
    """A ``TorchDispatchMode`` filing the matrix products made outside a linear layer's call with ``probe``."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    products = {torch.ops.aten.mm.default: 1, torch.ops.aten.addmm.default: 2}
    if hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        products[torch.ops.mkldnn._linear_pointwise.default] = 1

    class _Products(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            weight = products.get(func)
            if weight is None or probe.current not in BARE_PRODUCT_PHASES or probe._inside_linear:
                return out
            if probe.current == "generation":
                probe.record(out.dtype, args[weight].dtype)
            elif torch.is_grad_enabled():  # the update's forward (module docstring)
                probe.record(out.dtype, None)
            return out

    return _Products()
