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

import math as _math
import re
import unicodedata

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
    braces = {m.end() - 1 for m in _BOXED.finditer(text)}  # each box's opening brace
    if not braces:
        return None
    open_boxes: list[tuple[int, int]] = []  # (content start, brace depth outside it)
    depth, last = 0, None
    for i, ch in enumerate(text):  # one pass: many unclosed boxes cost no more than one
        if i in braces:
            open_boxes.append((i + 1, depth))
        if ch == "{":
            depth += 1
        elif ch == "}" and depth > 0:
            depth -= 1
            if open_boxes and open_boxes[-1][1] == depth:
                start = open_boxes.pop()[0]
                if last is None or start > last[0]:
                    last = (start, i)
    return None if last is None else text[last[0] : last[1]].strip()


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
        The value as a float, or ``None`` when the text is not one number, a fraction divides by zero, or the
        value overflows a float.
    """
    t = unicodedata.normalize("NFKC", text).strip().strip("$").strip()
    frac = re.fullmatch(r"(-?)\\d?frac\s*\{([^{}]+)\}\s*\{([^{}]+)\}", t)
    if frac:
        t = f"{frac.group(1)}{frac.group(2).strip()}/{frac.group(3).strip()}"
    t = t.removeprefix("\\$").removeprefix("$").removesuffix("\\%").removesuffix("%").strip()
    t = t.replace("−", "-").replace("\\!", "").replace("{,}", ",")
    if not _FULL_NUMBER_RE.match(t):
        return None
    # float, not Fraction: Fraction("1e99999999") would compute 10**99999999 (a reply could stall the scorer).
    values = [float(p.strip().replace(",", "")) for p in t.split("/")]
    if len(values) == 2:
        values = [values[0] / values[1]] if values[1] != 0 else [_math.inf]
    return values[0] if _math.isfinite(values[0]) else None


def last_number(text: str) -> str | None:
    """Return the last number written in ``text`` (same forms as :func:`parse_number`, as written), or
    ``None``."""
    found = _NUMBER_RE.findall(unicodedata.normalize("NFKC", text))
    return found[-1] if found else None
