"""Argument checks for the public SDK: a wrong type or an absurd number is refused before any rpc, naming it.

:func:`checked` wraps a public function or method so that every argument is checked against its type
annotation before the body runs; a mismatch raises :class:`~marti.errors.InvalidArgumentError` naming the
function, the argument, what it must be and the value. What is checked:

- ``str``: a string that UTF-8 can carry (no lone surrogate such as ``"\\udcff"``), as every proto field;
- ``bytes``, ``bool``, classes (``Trajectory``, ``TableConfig``, ...): ``isinstance``;
- ``int``: an integer (numpy integers count; ``bool`` does not) that fits 64 bits, as every proto field;
- ``float``: a real number (numpy floats count; ``bool`` does not) that is finite;
- ``X | None``, ``Optional``, ``Union``, ``Literal``: any member; ``Any``, callables, protocols, channels: nothing;
- ``Sequence[X]``: a sized iterable that is not text, whose items are ``X`` (numpy arrays count; an item
  that is a mapping is only checked to be one: the function names its bad fields itself);
- ``Mapping[K, V]`` / ``dict[K, V]``: a mapping whose keys are ``K`` and values ``V``.

Ranges (a count >= 1, a priority > 0) stay with each function: they differ from one argument to the next.

One check per argument: an argument that the function (or the request builder it calls) checks itself, with a
message naming the exact item, key or limit, is listed in ``own`` (``@checked(own=("batch_items",))``) and left to
that check entirely, so the generic one neither pre-empts its message nor refuses what it accepts.
"""

from __future__ import annotations

import collections.abc as cabc
import functools
import inspect
import math
import numbers
import types
import typing
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from marti.errors import InvalidArgumentError

F = TypeVar("F", bound=Callable[..., Any])
_INT64 = (-(2**63), 2**64 - 1)  # int64 and uint64 proto fields
_UNCHECKED = object()


@typing.overload
def checked(fn: F, /) -> F: ...
@typing.overload
def checked(*, own: Iterable[str]) -> Callable[[F], F]: ...


def checked(fn: F | None = None, /, *, own: Iterable[str] = ()) -> F | Callable[[F], F]:
    """Wrap ``fn`` (plain, method or ``async def``) to check its arguments against its annotations first.

    Used bare (``@checked``) or with ``own`` (``@checked(own=("priorities",))``): the arguments ``fn`` checks
    itself, before any rpc, with a more precise message; those are not looked at here.

    Raises (from the wrapped function):
        InvalidArgumentError: An argument does not match its annotation, naming the function and argument.
        TypeError: At decoration, an ``own`` name that is not a parameter of ``fn`` (a bug in the SDK, raised
            at import).
    """
    if fn is None:
        names = frozenset(own)
        return lambda f: _checked(f, names)
    return _checked(fn, frozenset(own))


def _checked(fn: F, own: frozenset[str]) -> F:
    """:func:`checked` with the set of arguments ``fn`` checks itself."""
    signature = inspect.signature(fn)
    if not own <= signature.parameters.keys():
        raise TypeError(f"{fn.__qualname__} has no parameter {sorted(own - signature.parameters.keys())}")
    hints: dict[str, Any] | None = None

    def check(args: tuple, kwargs: dict) -> None:
        nonlocal hints
        if hints is None:
            hints = {k: v for k, v in _hints(fn, signature).items() if k not in own}
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise InvalidArgumentError(f"{fn.__qualname__}: {exc}") from None
        for name, value in bound.arguments.items():
            tp = hints.get(name, _UNCHECKED)
            if tp is _UNCHECKED or signature.parameters[name].kind in (
                inspect.Parameter.VAR_POSITIONAL,
                inspect.Parameter.VAR_KEYWORD,
            ):
                continue
            if not matches(value, tp):
                raise InvalidArgumentError(
                    f"{fn.__qualname__}: {name} must be {describe(tp)}, got {_short(value)}{_why(value)}"
                )

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            check(args, kwargs)
            return await fn(*args, **kwargs)

        return typing.cast(F, async_wrapper)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        check(args, kwargs)
        return fn(*args, **kwargs)

    return typing.cast(F, wrapper)


def _hints(fn: Callable[..., Any], signature: inspect.Signature) -> dict[str, Any]:
    """Each parameter's evaluated annotation; one that cannot be evaluated (a TYPE_CHECKING name) is skipped."""
    out: dict[str, Any] = {}
    namespace = getattr(inspect.unwrap(fn), "__globals__", {})
    for name, param in signature.parameters.items():
        annotation = param.annotation
        if annotation is inspect.Parameter.empty or name in ("self", "cls"):
            continue
        if isinstance(annotation, str):
            holder = types.SimpleNamespace(__annotations__={name: annotation})
            try:  # typing's own evaluation of our source's annotations, one parameter at a time
                annotation = typing.get_type_hints(holder, globalns=dict(namespace))[name]
            except Exception:  # noqa: BLE001 - unknown at run time: leave unchecked
                continue
        out[name] = annotation
    return out


def matches(value: Any, tp: Any, shallow: bool = False) -> bool:
    """Whether ``value`` fits the annotation ``tp`` (see the module docstring for what is checked); ``shallow``:
    a mapping's keys and values are not looked at."""
    if tp is Any or tp is object or isinstance(tp, TypeVar):
        return True
    if tp is None or tp is type(None):
        return value is None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return any(matches(value, member, shallow) for member in typing.get_args(tp))
    if origin is typing.Literal:
        return value in typing.get_args(tp)
    if tp is str:
        return isinstance(value, str) and is_utf8(value)
    if tp is int:
        return _is_int(value) and _INT64[0] <= int(value) <= _INT64[1]
    if tp is float:
        return _is_real(value) and is_finite(value)
    if tp is bool:
        return isinstance(value, bool) or type(value).__name__ == "bool_"
    if origin in (cabc.Sequence, list, tuple) and origin is not None:
        return _sequence_matches(value, typing.get_args(tp), origin)
    if origin in (cabc.Mapping, dict, cabc.MutableMapping):
        return _mapping_matches(value, () if shallow else typing.get_args(tp))
    if isinstance(tp, type) and origin is None and tp.__module__ != "typing" and not _is_protocol(tp):
        return isinstance(value, tp)
    return True  # callables, protocols, aliases we cannot check


def is_utf8(text: str) -> bool:
    """Whether ``text`` is valid Unicode that UTF-8 (and so protobuf) can carry: no lone surrogate."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_text(value: Any, name: str) -> Any:
    """Return ``value``; if it is a ``str`` that UTF-8 cannot carry, refuse it naming ``name``.

    Non-text values pass through unchecked (their own checks apply).

    Raises:
        InvalidArgumentError: ``value`` is a ``str`` with a lone surrogate; the message names ``name``.
    """
    if isinstance(value, str) and not is_utf8(value):
        raise InvalidArgumentError(
            f"{name} must be valid Unicode that UTF-8 can carry (no lone surrogate), got {value!r:.80}"
        )
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_finite(value: numbers.Real) -> bool:
    """Whether a real number is finite (an integer too large for a float counts as not finite)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _is_protocol(tp: type) -> bool:
    return bool(getattr(tp, "_is_protocol", False))


def _sequence_matches(value: Any, args: tuple, origin: Any) -> bool:
    if isinstance(value, (str, bytes, bytearray, cabc.Mapping)) or not isinstance(value, cabc.Iterable):
        return False
    if not hasattr(value, "__len__"):
        return False
    if origin is tuple and args and args[-1] is not Ellipsis:
        return len(value) == len(args) and all(matches(v, a) for v, a in zip(value, args, strict=True))
    item = args[0] if args else Any
    return item is Any or all(matches(v, item, shallow=True) for v in value)


def _mapping_matches(value: Any, args: tuple) -> bool:
    if not isinstance(value, cabc.Mapping):
        return False
    if len(args) != 2:
        return True
    key, val = args
    return all(matches(k, key) and matches(v, val) for k, v in value.items())


def describe(tp: Any) -> str:
    """Words for what an annotation asks for (``"an integer within 64 bits or None"``)."""
    if tp is None or tp is type(None):
        return "None"
    if tp is Any:
        return "anything"
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        members = typing.get_args(tp)
        return "anything" if Any in members else " or ".join(describe(m) for m in members)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    words = {
        int: "an integer within 64 bits",
        float: "a finite number",
        bool: "True or False",
        str: "a string",
        bytes: "bytes",
    }
    if tp in words:
        return words[tp]
    if origin in (cabc.Sequence, list, tuple):
        args = typing.get_args(tp)
        return f"a sequence of {describe(args[0])}" if args and args[0] is not Any else "a sequence"
    if origin in (cabc.Mapping, dict, cabc.MutableMapping):
        args = typing.get_args(tp)
        return f"a mapping of {describe(args[0])} to {describe(args[1])}" if len(args) == 2 else "a mapping"
    return f"a {getattr(tp, '__name__', str(tp))}"


def _why(value: Any) -> str:
    """A hint when the value holds text UTF-8 cannot carry (the usual reason a ``str`` is refused), else ``""``."""
    texts = [value] if isinstance(value, str) else []
    if isinstance(value, cabc.Mapping):
        texts = [t for kv in value.items() for t in kv if isinstance(t, str)]
    elif isinstance(value, (list, tuple)):
        texts = [t for t in value if isinstance(t, str)]
    if any(not is_utf8(t) for t in texts):
        return " (text must be valid Unicode that UTF-8 can carry: no lone surrogate)"
    return ""


def _short(value: Any) -> str:
    """``repr(value)`` cut to 80 characters, with its type."""
    text = repr(value)
    text = text if len(text) <= 80 else text[:77] + "..."
    return f"{text} ({type(value).__name__})"
