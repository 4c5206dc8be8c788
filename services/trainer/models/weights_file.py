"""A whole model's weights as one safetensors file, one entry per distinct parameter (tied weights, such as a
language model head sharing its input embedding, are written once under one of their names).

Unlike ``safetensors.torch.save_model`` / ``load_model``, these do not ask torch which names cover a tensor's whole
storage, so they work on ZeRO-3 weights gathered into views of a larger flat buffer (``strategy.gathered()``),
where ``save_model`` refuses tied weights ("None is covering the entire storage"). Files written by
``save_model`` load the same way.
"""

from __future__ import annotations

from pathlib import Path

import torch

from marti.errors import FailedPreconditionError


def save_weights(model: torch.nn.Module, path: str | Path) -> None:
    """Write ``model``'s state dict to the safetensors file ``path``, each tied tensor once (its first name)."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        tensors[name] = tensor.detach().clone().contiguous().cpu()
    save_file(tensors, str(path), metadata={"format": "pt"})


def load_weights(model: torch.nn.Module, path: str | Path, device: str) -> None:
    """Copy the weights :func:`save_weights` (or ``safetensors.torch.save_model``) wrote into ``model``.

    Raises:
        FailedPreconditionError: The file lacks a weight of the model that is not tied to one it has, or has a
            name the model does not (the message names the first few).
    """
    from safetensors.torch import load_file

    state = load_file(str(path), device=device)
    own = model.state_dict(keep_vars=True)
    written = {id(own[name]) for name in state if name in own}
    missing = [n for n, t in own.items() if n not in state and id(t) not in written]
    unexpected = [n for n in state if n not in own]
    if missing or unexpected:
        raise FailedPreconditionError(
            f"weights file {path} does not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    model.load_state_dict(state, strict=False)
