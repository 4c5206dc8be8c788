"""An LLM judge's verdict: a frozen agent of the team speaks last and its verdict is the reward of the team's
answer (``reward.judge_agent``, docs/datasets.md "An LLM judge").

The verdict is read from the judge's last reply with a pattern (default :data:`JUDGE_PATTERN`: the last
``Verdict: X`` in the reply, case ignored); ``X`` is a number in [0, 1] (``0.8``, ``0,8``, or a fraction such as
``3/4``), or a word: ``correct`` / ``yes`` /
``right`` / ``true`` read as 1.0, ``incorrect`` / ``no`` / ``wrong`` / ``false`` as 0.0. Anything else (no match,
a number outside [0, 1], another word) is unreadable: :func:`read_verdict` returns None and the trainer scores it
0.0 with a warning and counts it (``judge/unreadable``).
"""

from __future__ import annotations

import math
import re

from marti.errors import InvalidArgumentError

__all__ = ["JUDGE_PATTERN", "compile_judge_pattern", "read_verdict"]

#: The default verdict pattern: group 1 is the word or number after the last ``Verdict:``.
JUDGE_PATTERN = r"(?i)verdict\s*[:=]\s*\**\s*([\w.,/+-]+)"

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


def compile_judge_pattern(pattern: str) -> re.Pattern[str]:
    """Compile a verdict pattern (Python ``re``; group 1 is the verdict if the pattern has a group, else the
    whole match).

    Raises:
        InvalidArgumentError: The pattern does not compile (named with the regex error).
    """
    try:
        return re.compile(pattern)
    except re.error as e:
        raise InvalidArgumentError(f"reward.judge_pattern {pattern!r} does not compile: {e}") from None


def read_verdict(reply: str, pattern: re.Pattern[str] | str = JUDGE_PATTERN) -> float | None:
    """The verdict in a judge's reply: a score in [0, 1], or None when it cannot be read.

    Args:
        reply: The judge's reply text.
        pattern: The verdict pattern (its LAST match counts).

    Returns:
        1.0 / 0.0 for the words of the module docstring, the number when it is in [0, 1], else None.
    """
    rx = compile_judge_pattern(pattern) if isinstance(pattern, str) else pattern
    matches = list(rx.finditer(reply or ""))
    if not matches:
        return None
    m = matches[-1]
    text = (m.group(1) if rx.groups else m.group(0)).strip().strip(".,*!").lower()
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
