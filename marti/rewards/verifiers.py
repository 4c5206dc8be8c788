"""Built-in verifiers: score a reply against a label, 1.0 when correct and 0.0 when not.

Every verifier is ``verifier(completion: str, label: str, **options) -> float``; :func:`make_verifier` checks the
options once and returns a two-argument callable. The answer is found in the reply by
:func:`marti.rewards.answers.extract_answer` (last ``\\boxed{}``, else an ``Answer:`` line), so reasoning
before the answer does not count. Kinds:

* ``exact``: the answer (the whole reply when none is found) equals the label after Unicode NFKC, whitespace
  collapsing and stripping; letter case is ignored unless ``ignore_case=False``.
* ``numeric``: the answer read as a number (integers, decimals, ``3/4``, ``\\frac{3}{4}``, ``1,234``, ``50%``
  as 50; the answer's last number if it is not one number; the reply's last number when no answer is found)
  is within ``tolerance`` (relative, default ``1e-6``) or ``abs_tolerance`` (absolute, default ``1e-9``) of
  the label (``math.isclose``).
* ``multiple_choice``: the chosen letter (``B``, ``(B)``, ``Answer: B``, ``the answer is B.``, ``**B**``,
  lower case too) equals the label's letter; ``letters`` (default ``ABCDEFGHIJ``) are the possible choices.
* ``math``: ``math-verify`` (``math_verify.parse`` / ``verify``) decides whether the answer and the label are
  the same mathematical object (``\\frac{1}{2}`` and ``0.5``, ``\\sqrt{2}`` and ``2^{1/2}``, sets, intervals,
  equations' right-hand sides); a label math-verify cannot parse (a word) is compared as ``exact`` does.
  math-verify runs in worker processes (:mod:`marti.rewards.math_worker`) with its own ``SIGALRM`` timeouts
  off (they raise outside the main thread, where the env server calls envs, and cannot stop sympy computing a
  power tower such as ``9^{9^{9^{9}}}``); a worker that takes over ``math_timeout_s`` (default 5 s) is killed
  and the answer is wrong (a warning names it). An answer longer than ``max_chars`` (default 1000) is wrong
  without being parsed, and a reply without a boxed answer or answer line is read from its last ``max_chars``
  characters.
* ``regex``: the user's ``pattern`` (Python ``re``) extracts the answer: the LAST match in the reply, its
  group 1 when the pattern has a group, else the whole match; that text must equal the label after the same
  normalisation as ``exact`` (``ignore_case`` default False). No match scores 0. ``extract_answer`` is not
  used: the pattern is the extraction. The match runs in a worker process, as math-verify does, killed past
  :data:`marti.rewards.math_worker.REGEX_TIMEOUT_S` (1 s): a pattern that backtracks for ever on a reply (``(a+)+$`` on ``"a" * 30 + "!"``
  took 73 s in ``re``) scores 0 there, and a warning names it.
"""

from __future__ import annotations

import functools
import importlib.util
import math as _math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from marti.errors import FailedPreconditionError, InvalidArgumentError
from marti.rewards.answers import extract_answer, last_number, normalize_text, parse_number
from marti.rewards.math_worker import REGEX_TIMEOUT_S, last_match_in_worker, verify_in_worker

__all__ = [
    "VERIFIERS",
    "VERIFIER_OPTIONS",
    "BoundVerifier",
    "exact",
    "extract_answer",
    "make_verifier",
    "math",
    "multiple_choice",
    "numeric",
    "regex",
]

#: A verifier bound to its options: ``(completion, label) -> score in [0, 1]``.
Verifier = Callable[[str, str], float]


def _text_inputs(fn: Callable[..., float]) -> Callable[..., float]:
    """Refuse a completion or label that is not ``str`` (named) before ``fn`` sees it."""

    @functools.wraps(fn)
    def wrapper(completion: Any, label: Any, **options: Any) -> float:
        for name, value in (("completion", completion), ("label", label)):
            if not isinstance(value, str):
                raise InvalidArgumentError(
                    f"{fn.__name__} verifier: {name} must be str, got {type(value).__name__} {value!r:.80}"
                )
        return fn(completion, label, **options)

    return wrapper


@_text_inputs
def exact(completion: str, label: str, *, ignore_case: bool = True) -> float:
    """1.0 when the reply's answer (the whole reply when none is found) equals ``label`` after
    :func:`~marti.rewards.answers.normalize_text` (NFKC, whitespace, case unless ``ignore_case=False``).

    Raises:
        InvalidArgumentError: ``completion`` or ``label`` is not ``str``.
    """
    answer = extract_answer(completion)
    given = completion if answer is None else answer
    return float(normalize_text(given, ignore_case) == normalize_text(label, ignore_case))


def _reply_number(completion: str) -> float | None:
    answer = extract_answer(completion)
    if answer is not None:
        value = parse_number(answer)
        if value is not None:
            return value
    raw = last_number(completion if answer is None else answer)
    return None if raw is None else parse_number(raw)


@_text_inputs
def numeric(completion: str, label: str, *, tolerance: float = 1e-6, abs_tolerance: float = 1e-9) -> float:
    """1.0 when the reply's number is within ``tolerance`` (relative) or ``abs_tolerance`` (absolute) of the
    label's (see the module docstring for how numbers are read).

    Raises:
        InvalidArgumentError: ``label`` is not a number (the value is named), or an input is not ``str``.
    """
    gold = parse_number(label)
    if gold is None:
        raise InvalidArgumentError(f"numeric verifier: label {label!r:.80} is not a number")
    value = _reply_number(completion)
    if value is None:
        return 0.0
    return float(_math.isclose(value, gold, rel_tol=tolerance, abs_tol=abs_tolerance))


@functools.lru_cache(maxsize=64)
def _choice_patterns(letters: str) -> tuple[re.Pattern[str], re.Pattern[str], re.Pattern[str]]:
    cls = "[" + re.escape(letters + letters.lower()) + "]"
    # An answer's leading letter: "B", "(B)", "[B]", "B.", "B) 42", "B because ...".
    loose = re.compile(rf"^[(\[]?\s*({cls})\s*[)\]]?(?:[.:)]|\s|$)")
    # A whole reply's leading letter must be marked: "(B) ...", "B. ...", "B) ...", or the reply is the letter.
    strict = re.compile(rf"^(?:[(\[]\s*({cls})\s*[)\]]|({cls})(?:[.:)]|$))")
    paren = re.compile(rf"\(({cls})\)")
    return loose, strict, paren


def _choice(text: str, letters: str) -> str | None:
    loose, strict, paren = _choice_patterns(letters)
    answer = extract_answer(text)
    candidate = (text if answer is None else answer).strip().strip("*").strip()
    m = (strict if answer is None else loose).match(candidate)
    if m:
        return next(g for g in m.groups() if g).upper()
    found = paren.findall(candidate)
    return found[-1].upper() if found else None


@_text_inputs
def multiple_choice(completion: str, label: str, *, letters: str = "ABCDEFGHIJ") -> float:
    """1.0 when the reply's chosen letter equals the label's (``"B"``, ``"(B)"``, ``"Answer: B"`` ...).

    Raises:
        InvalidArgumentError: ``label`` names none of ``letters`` (the value is named), or an input is not
            ``str``.
    """
    gold = _choice(label, letters)
    if gold is None:
        raise InvalidArgumentError(f"multiple_choice verifier: label {label!r:.80} is not one of {letters}")
    return float(_choice(completion, letters) == gold)


def _math_verify() -> None:
    """Refuse the math verifier where math-verify is not installed (found without importing it here)."""
    if importlib.util.find_spec("math_verify") is None:
        raise FailedPreconditionError(
            "the math verifier needs the math-verify package: pip install 'marti-agent[trainer]' "
            "(or pip install math-verify)"
        )


@_text_inputs
def math(completion: str, label: str, *, max_chars: int = 1000, math_timeout_s: float = 5.0) -> float:
    """1.0 when math-verify finds the reply's answer equal to ``label`` (see the module docstring); math-verify
    runs in a worker process (:mod:`marti.rewards.math_worker`) that is killed past ``math_timeout_s`` seconds,
    and then the answer is wrong.

    Raises:
        InvalidArgumentError: ``label`` is longer than ``max_chars``, or an input is not ``str``.
        FailedPreconditionError: math-verify is not installed.
        InternalError: The worker process could not start.
    """
    if len(label) > max_chars:
        raise InvalidArgumentError(
            f"math verifier: label has {len(label)} characters, above max_chars={max_chars}"
        )
    _math_verify()
    answer = extract_answer(completion)
    if answer is not None and len(answer) > max_chars:
        return 0.0
    given = completion[-max_chars:] if answer is None else answer
    same = verify_in_worker(label, given, math_timeout_s)
    if same is None:  # a label math-verify cannot parse (a word): compared as text
        return float(normalize_text(completion if answer is None else answer) == normalize_text(label))
    return float(same)


@functools.lru_cache(maxsize=256)
def _compile(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as e:
        raise InvalidArgumentError(f"regex verifier: pattern {pattern!r} does not compile: {e}") from None


@_text_inputs
def regex(
    completion: str,
    label: str,
    *,
    pattern: str,
    ignore_case: bool = False,
    regex_timeout_s: float = REGEX_TIMEOUT_S,
) -> float:
    """1.0 when the text ``pattern`` extracts from the reply (last match; group 1 if the pattern has a group,
    else the whole match) equals ``label`` after normalisation (case kept unless ``ignore_case``). The match
    runs in a worker process (:func:`marti.rewards.math_worker.last_match_in_worker`) killed past
    ``regex_timeout_s`` seconds (default :data:`~marti.rewards.math_worker.REGEX_TIMEOUT_S`); then the reply
    scores 0.0.

    Raises:
        InvalidArgumentError: ``pattern`` does not compile (named), or an input is not ``str``.
        InternalError: The worker process could not start.
    """
    _compile(pattern)
    found = last_match_in_worker(pattern, completion, regex_timeout_s)
    if found is None:
        return 0.0
    return float(normalize_text(found, ignore_case) == normalize_text(label, ignore_case))


#: kind -> verifier function.
VERIFIERS: dict[str, Callable[..., float]] = {
    "exact": exact,
    "numeric": numeric,
    "multiple_choice": multiple_choice,
    "math": math,
    "regex": regex,
}


def _number_option(name: str, value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not _math.isfinite(value)
        or value < 0
    ):
        raise InvalidArgumentError(f"verifier option {name!r} must be a finite number >= 0, got {value!r}")
    return float(value)


def _positive_number_option(name: str, value: Any) -> float:
    if _number_option(name, value) <= 0:
        raise InvalidArgumentError(f"verifier option {name!r} must be a number > 0, got {value!r}")
    return float(value)


def _letters_option(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value or len(set(value)) != len(value) or not value.isalnum():
        raise InvalidArgumentError(
            f"verifier option {name!r} must be a non-empty string of distinct letters, got {value!r}"
        )
    return value


def _bool_option(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgumentError(f"verifier option {name!r} must be true or false, got {value!r}")
    return value


def _positive_int_option(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError(f"verifier option {name!r} must be an integer >= 1, got {value!r}")
    return value


def _pattern_option(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidArgumentError(
            f"verifier option {name!r} must be a non-empty regex string, got {value!r}"
        )
    _compile(value)
    return value


_OPTION_CHECKS: dict[str, Callable[[str, Any], Any]] = {
    "ignore_case": _bool_option,
    "tolerance": _number_option,
    "abs_tolerance": _number_option,
    "letters": _letters_option,
    "max_chars": _positive_int_option,
    "math_timeout_s": _positive_number_option,
    "regex_timeout_s": _positive_number_option,
    "pattern": _pattern_option,
}

#: kind -> (its options, the options it requires).
VERIFIER_OPTIONS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "exact": (("ignore_case",), ()),
    "numeric": (("tolerance", "abs_tolerance"), ()),
    "multiple_choice": (("letters",), ()),
    "math": (("max_chars", "math_timeout_s"), ()),
    "regex": (("pattern", "ignore_case", "regex_timeout_s"), ("pattern",)),
}


@dataclass(frozen=True)
class BoundVerifier:
    """A verifier with its checked options; call it as ``verifier(completion, label) -> float``.

    Attributes:
        kind: One of :data:`VERIFIERS`.
        options: Its keyword options (checked by :func:`make_verifier`).
    """

    kind: str
    options: dict[str, Any] = field(default_factory=dict)

    def __call__(self, completion: str, label: str) -> float:
        """Score ``completion`` against ``label``: 1.0 correct, 0.0 not (see the module docstring)."""
        return VERIFIERS[self.kind](completion, label, **self.options)


def make_verifier(kind: str, **options: Any) -> BoundVerifier:
    """Build the verifier ``kind`` with its options, checked now rather than at the first reply.

    Args:
        kind: ``exact``, ``numeric``, ``multiple_choice``, ``math`` or ``regex``.
        **options: The kind's options (see :data:`VERIFIER_OPTIONS` and the module docstring); an option given
            as ``None`` is left at its default.

    Returns:
        A :class:`BoundVerifier`.

    Raises:
        InvalidArgumentError: An unknown kind (the kinds are named), an option the kind does not take (its
            options are named), a missing required option (``regex`` needs ``pattern``), or a bad value.
        FailedPreconditionError: ``math`` without math-verify installed.
    """
    if kind not in VERIFIERS:
        raise InvalidArgumentError(f"unknown verifier {kind!r} (verifiers: {', '.join(VERIFIERS)})")
    allowed, required = VERIFIER_OPTIONS[kind]
    given = {k: v for k, v in options.items() if v is not None}
    for name in given:
        if name not in allowed:
            raise InvalidArgumentError(
                f"verifier {kind!r} takes no option {name!r} (its options: {', '.join(allowed) or 'none'})"
            )
    for name in required:
        if name not in given:
            raise InvalidArgumentError(f"verifier {kind!r} needs the option {name!r}")
    checked = {name: _OPTION_CHECKS[name](name, value) for name, value in given.items()}
    if kind == "math":
        _math_verify()
    return BoundVerifier(kind, checked)
