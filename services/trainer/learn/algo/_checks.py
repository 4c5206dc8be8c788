"""Input checks shared by the algorithm modules.

Every check raises :class:`marti.errors.InvalidArgumentError` with a message that names the argument, the bad
value or shape, and what was expected. They run on every call (never ``assert``, which ``python -O`` removes).
"""

from __future__ import annotations

import math

import torch

from marti.errors import InvalidArgumentError


def check_tensor(name: str, value: object, ndim: int) -> torch.Tensor:
    """Check that ``value`` is a tensor with ``ndim`` dimensions.

    Args:
        name: Argument name used in the error message.
        value: The object to check.
        ndim: Required number of dimensions.

    Returns:
        ``value`` unchanged.

    Raises:
        InvalidArgumentError: ``value`` is not a tensor or has another number of dimensions.
    """
    if not isinstance(value, torch.Tensor):
        raise InvalidArgumentError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dim() != ndim:
        raise InvalidArgumentError(f"{name} must have {ndim} dimension(s), got shape {tuple(value.shape)}")
    return value


def check_same_shape(name: str, value: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    """Raise unless ``value`` has exactly the shape of ``ref``.

    Args:
        name: Name of the checked argument.
        value: Tensor to check.
        ref_name: Name of the reference argument.
        ref: Tensor whose shape is required.

    Raises:
        InvalidArgumentError: the shapes differ.
    """
    if tuple(value.shape) != tuple(ref.shape):
        raise InvalidArgumentError(
            f"{name} has shape {tuple(value.shape)} but {ref_name} has shape {tuple(ref.shape)}; they must match"
        )


def as_bool_mask(name: str, mask: torch.Tensor) -> torch.Tensor:
    """Turn a 0/1 mask of any dtype into a bool tensor.

    Args:
        name: Argument name used in the error message.
        mask: Bool tensor, or a numeric tensor holding only 0 and 1.

    Returns:
        A bool tensor of the same shape.

    Raises:
        InvalidArgumentError: a numeric mask holds a value other than 0 or 1 (the first such value is named).
    """
    if mask.dtype == torch.bool:
        return mask
    bad = (mask != 0) & (mask != 1)
    if bool(bad.any()):
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise InvalidArgumentError(f"{name} must hold only 0 and 1, got {mask[idx].item()} at index {idx}")
    return mask != 0


def check_finite(name: str, value: torch.Tensor, where: torch.Tensor | None = None) -> None:
    """Raise if ``value`` holds NaN or +-inf (only at positions where ``where`` is True, if given).

    Args:
        name: Argument name used in the error message.
        value: Tensor to check.
        where: Optional bool tensor broadcastable to ``value``; positions outside it are not checked.

    Raises:
        InvalidArgumentError: a non-finite value was found; the message names its index and value.
    """
    bad = ~torch.isfinite(value)
    if where is not None:
        bad = bad & where
    if bool(bad.any()):
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise InvalidArgumentError(f"{name} must be finite, got {value[idx].item()} at index {idx}")


def check_real(
    name: str,
    value: object,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """Check that ``value`` is a finite real number inside an interval.

    Args:
        name: Field or argument name used in the error message.
        value: The value to check (bool is rejected).
        low: Lower bound, or None for none.
        high: Upper bound, or None for none.
        low_open: Exclude ``low`` itself.
        high_open: Exclude ``high`` itself.

    Returns:
        ``value`` as a float.

    Raises:
        InvalidArgumentError: not a real number, not finite, or outside the interval (the bound is named).
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgumentError(f"{name} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise InvalidArgumentError(f"{name} must be finite, got {value!r}")
    if low is not None and (v < low or (low_open and v == low)):
        op = ">" if low_open else ">="
        raise InvalidArgumentError(f"{name} must be {op} {low}, got {value!r}")
    if high is not None and (v > high or (high_open and v == high)):
        op = "<" if high_open else "<="
        raise InvalidArgumentError(f"{name} must be {op} {high}, got {value!r}")
    return v
