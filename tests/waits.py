"""Bounded waits on a condition, for tests: a phase ends when what it waits for has happened, not after a fixed
sleep that a loaded machine can outrun."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


def until(predicate: Callable[[], object], what: str, timeout_s: float = 30.0, every_s: float = 0.01) -> None:
    """Return once ``predicate()`` is truthy, checking every ``every_s`` seconds.

    Raises:
        AssertionError: naming ``what``, when ``timeout_s`` seconds passed first.
    """
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(every_s)


async def until_async(
    predicate: Callable[[], object], what: str, timeout_s: float = 30.0, every_s: float = 0.005
) -> None:
    """:func:`until` for a coroutine: the event loop runs between checks.

    Raises:
        AssertionError: naming ``what``, when ``timeout_s`` seconds passed first.
    """
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        await asyncio.sleep(every_s)
