"""An LLM judge's verdict: a frozen agent of the team speaks last and its verdict is the reward of the team's
answer (``reward.judge_agent``, docs/datasets.md "An LLM judge").

The verdict is read from the judge's last reply with a pattern (default :data:`JUDGE_PATTERN`: the last
``Verdict: X`` in the reply, case ignored); ``X`` is a number in [0, 1] (``0.8``, ``0,8``, or a fraction such as
``3/4``), or a word: ``correct`` / ``yes`` /
``right`` / ``true`` read as 1.0, ``incorrect`` / ``no`` / ``wrong`` / ``false`` as 0.0. Anything else (no match,
a number outside [0, 1], another word) is unreadable: :func:`read_verdict` returns None and the trainer scores it
0.0 with a warning and counts it (``judge/unreadable``).

The pattern is a user's regex run on model output, so it runs with the :mod:`regex` package's ``timeout=``: a
pattern that backtracks catastrophically on a reply (``(a|a)+$`` on ``"a" * 40 + "b"``) stops after
``reward.judge_pattern_timeout_s`` seconds (default :data:`JUDGE_PATTERN_TIMEOUT_S`) with
:class:`~marti.errors.DeadlineExceededError`, which the trainer scores as an unreadable verdict (0.0, a warning
naming the pattern and the time limit), instead of hanging the job.
"""

from __future__ import annotations

import math
import re

import regex

from marti.errors import DeadlineExceededError, InvalidArgumentError

__all__ = ["JUDGE_PATTERN", "JUDGE_PATTERN_TIMEOUT_S", "compile_judge_pattern", "read_verdict"]

#: The default verdict pattern: group 1 is the word or number after the last ``Verdict:``.
JUDGE_PATTERN = r"(?i)verdict\s*[:=]\s*\**\s*([\w.,/+-]+)"

#: Default seconds the verdict pattern may run on one reply (``reward.judge_pattern_timeout_s``): the default
#: pattern takes microseconds on a long reply; a pattern that backtracks catastrophically would never end.
JUDGE_PATTERN_TIMEOUT_S = 1.0

_WORDS = {
    "correct": 1.0,
    "yes": 1.0,
    "right": 1.0,
    "true": 1.0,
    "incorrect": 0.0,
    "no": 0.0,
    "wrong": 0.0,
    "false": 0.0,
}


def compile_judge_pattern(pattern: str) -> regex.Pattern[str]:
    """Compile a verdict pattern (the :mod:`regex` package, whose default syntax is Python ``re``'s; group 1 is
    the verdict if the pattern has a group, else the whole match).

    Raises:
        InvalidArgumentError: The pattern does not compile (named with the regex error).
    """
    try:
        return regex.compile(pattern)
    except regex.error as e:
        raise InvalidArgumentError(f"reward.judge_pattern {pattern!r} does not compile: {e}") from None


def read_verdict(
    reply: str,
    pattern: regex.Pattern[str] | str = JUDGE_PATTERN,
    timeout_s: float = JUDGE_PATTERN_TIMEOUT_S,
) -> float | None:
    """The verdict in a judge's reply: a score in [0, 1], or None when it cannot be read.

    Args:
        reply: The judge's reply text.
        pattern: The verdict pattern (its LAST match counts).
        timeout_s: Seconds the pattern may run over ``reply`` (all its matches together).

    Returns:
        1.0 / 0.0 for the words of the module docstring, the number when it is in [0, 1], else None (None too
        when the last match leaves the pattern's group 1 out: ``Verdict: (\\w+)|N/A`` matching ``N/A``).

    Raises:
        DeadlineExceededError: The pattern ran past ``timeout_s`` seconds (catastrophic backtracking); the
            message names the pattern, the limit and the reply's length.
        InvalidArgumentError: ``pattern`` is text that does not compile.
    """
    rx = compile_judge_pattern(pattern) if isinstance(pattern, str) else pattern
    said = reply or ""
    try:
        matches = list(rx.finditer(said, timeout=timeout_s))
    except TimeoutError:
        raise DeadlineExceededError(
            f"reward.judge_pattern {rx.pattern!r} ran past reward.judge_pattern_timeout_s {timeout_s} s on a "
            f"reply of {len(said)} characters (catastrophic backtracking: rewrite the pattern, e.g. without a "
            "repeated group of repeats such as (a+)+)"
        ) from None
    if not matches:
        return None
    m = matches[-1]
    found = m.group(1) if rx.groups else m.group(0)
    if found is None:  # group 1 took no part in the match (``Verdict: (\w+)|N/A`` matched ``N/A``)
        return None
    text = found.strip().strip(".,*!").lower()
    if text in _WORDS:
        return _WORDS[text]
    fraction = re.fullmatch(r"(\d+)/(\d+)", text)
    if fraction:  # "1/2" is a half, not 1
        num, den = int(fraction[1]), int(fraction[2])
        return num / den if den and num <= den else None
    if re.fullmatch(r"\d+,\d+", text):  # a decimal comma: "0,8"
        text = text.replace(",", ".")
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and 0.0 <= value <= 1.0 else None
