"""Answer extraction shared by the built-in verifiers (:mod:`marti.rewards.verifiers`).

A model's reply usually holds reasoning, then the answer. :func:`extract_answer` finds the answer part, so a
verifier scores the answer and not the working:

1. the content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), nested braces included;
2. else the text after the last ``Answer:`` / ``Final answer:`` / ``answer is`` / ``答案是`` / ``答案：`` on its
   line (surrounding ``$``, ``**`` and a final period removed);
3. else ``None`` (the numeric verifier then reads the last number of the text, :func:`last_number`).

All text is Unicode; nothing here drops non-ASCII characters.
"""

from __future__ import annotations

import math
import re
import unicodedata
from fractions import Fraction

__all__ = ["extract_answer", "last_boxed", "last_number", "normalize_text", "parse_number"]

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_LINE = re.compile(
    r"\b(?:final\s+answer|answer)\s*(?:is\s*[:：]?|[:：=])[ \t]*(?P<a>[^\n]*)"
    r"|答案\s*(?:(?:是|为)\s*[:：]?|[:：])[ \t]*(?P<zh>[^\n]*)",
    re.IGNORECASE,
)
_NUMBER = r"[-+−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+−]?\.\d+(?:[eE][-+]?\d+)?"
_NUMBER_RE = re.compile(rf"(?<![\w.])(?:{_NUMBER})(?:\s*/\s*(?:{_NUMBER}))?")
_FULL_NUMBER_RE = re.compile(rf"^(?:{_NUMBER})(?:\s*/\s*(?:{_NUMBER}))?$")
_WS = re.compile(r"\s+")


def normalize_text(text: str, ignore_case: bool = True) -> str:
    """Normalise text for comparison: Unicode NFKC, whitespace runs to one space, stripped, and (with
    ``ignore_case``) Unicode case folding (``str.casefold``: ``"Straße"`` matches ``"STRASSE"``).

    NFKC makes compatibility forms equal (full-width ``"４２"`` is ``"42"``); other characters are kept.
    """
    out = _WS.sub(" ", unicodedata.normalize("NFKC", text)).strip()
    return out.casefold() if ignore_case else out


def last_boxed(text: str) -> str | None:
    """Return the content of the last ``\\boxed{...}`` / ``\\fbox{...}`` in ``text`` (nested braces kept
    balanced), or ``None`` when there is none or the last one is never closed."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    for start in reversed(starts):
        depth = 1
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                return text[start:i].strip()
    return None


def _clean_answer_line(answer: str) -> str:
    answer = answer.strip()
    if answer.endswith((".", "。")):
        answer = answer[:-1].rstrip()
    answer = answer.strip("*").strip()
    if len(answer) >= 2 and answer[0] == answer[-1] == "$":
        answer = answer[1:-1].strip()
    return answer


def extract_answer(text: str) -> str | None:
    """Find the answer in a reply (see the module docstring for the rules, in order).

    Args:
        text: The reply (any Unicode text).

    Returns:
        The answer text, stripped, or ``None`` when the reply has no boxed answer and no answer line (or the
        answer line is empty).
    """
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    found = list(_ANSWER_LINE.finditer(text))
    for m in reversed(found):
        answer = _clean_answer_line(m.group("a") if m.group("a") is not None else m.group("zh"))
        if answer:
            return answer
    return None


def parse_number(text: str) -> float | None:
    """Read ``text`` as one number: an integer, a decimal (``-2.5``, ``.5``, ``1e-3``), a fraction
    (``3/4``, ``-1/3``) or a number with thousands separators (``1,234,567.5``: commas only between groups
    of three digits). Surrounding ``$``, a currency ``$`` prefix, a trailing ``%`` (``50%`` reads as 50) and
    LaTeX ``\\frac{a}{b}`` / ``\\dfrac`` are accepted.

    Returns:
        The value as a float (exact fractions are divided), or ``None`` when the text is not one number
        (or a fraction divides by zero).
    """
    t = unicodedata.normalize("NFKC", text).strip().strip("$").strip()
    frac = re.fullmatch(r"(-?)\\d?frac\s*\{([^{}]+)\}\s*\{([^{}]+)\}", t)
    if frac:
        t = f"{frac.group(1)}{frac.group(2).strip()}/{frac.group(3).strip()}"
    t = t.removeprefix("\\$").removeprefix("$").removesuffix("\\%").removesuffix("%").strip()
    t = t.replace("−", "-").replace("\\!", "").replace("{,}", ",")
    if not _FULL_NUMBER_RE.match(t):
        return None
    parts = [p.strip().replace(",", "") for p in t.split("/")]
    try:
        values = [Fraction(p) for p in parts]
    except (ValueError, ZeroDivisionError):
        return None
    if len(values) == 2:
        if values[1] == 0:
            return None
        return float(values[0] / values[1])
    value = float(values[0])
    return value if math.isfinite(value) else None


def last_number(text: str) -> str | None:
    """Return the last number written in ``text`` (same forms as :func:`parse_number`, as written), or
    ``None``."""
    found = _NUMBER_RE.findall(unicodedata.normalize("NFKC", text))
    return found[-1] if found else None
