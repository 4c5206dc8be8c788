"""One measured phase of ``marti bench scale`` (calls, errors by type, latencies, wall time, server RSS), and
the probe of a server limit."""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass, field
from typing import Any

from benchmarks.broker import pct
from benchmarks.scale.servers import Server


@dataclass
class Phase:
    """What one phase measured: successful calls, errors by type, call latencies (s), wall time (s), and
    the server's RSS (MB) when it ended.

    Attributes:
        name: Table name (service / phase).
        n: Sessions or agents in the phase.
        unit: What one latency is.
    """

    name: str
    n: int
    unit: str = "call"
    ok: int = 0
    errors: collections.Counter = field(default_factory=collections.Counter)
    lat: list[float] = field(default_factory=list)
    wall: float = 0.0
    count: int = 0
    rss_mb: float | None = None
    error_examples: dict[str, str] = field(default_factory=dict)

    def error(self, exc: BaseException) -> None:
        """Counts ``exc`` under its type name and keeps its first message as an example."""
        name = type(exc).__name__
        self.errors[name] += 1
        self.error_examples.setdefault(name, str(exc)[:300])

    async def timed(self, coro) -> Any:
        """Awaits ``coro``, timing it; returns its result, or None after counting its error."""
        t = time.perf_counter()
        try:
            out = await coro
        except Exception as exc:  # every failure is a result of the bench, counted by type
            self.error(exc)
            return None
        self.lat.append(time.perf_counter() - t)
        self.ok += 1
        return out

    def summary(self) -> dict:
        """The numbers of the phase (what ``--json`` writes)."""
        rate_count = self.count or self.ok
        return {
            "n": self.n,
            "ok": self.ok,
            "errors": sum(self.errors.values()),
            "errors_by_type": dict(self.errors),
            "error_examples": self.error_examples,
            "latency_per": self.unit,
            "p50_ms": pct(self.lat, 50) * 1e3 if self.lat else None,
            "p99_ms": pct(self.lat, 99) * 1e3 if self.lat else None,
            "wall_s": self.wall,
            "count": rate_count,
            "rate_per_s": rate_count / self.wall if self.wall > 0 else None,
            "rss_mb": self.rss_mb,
        }


async def gather_phase(phase: Phase, server: Server, coros) -> list:
    """Runs ``coros`` concurrently under ``phase`` (wall clock, RSS after)."""
    t0 = time.perf_counter()
    out = await asyncio.gather(*coros)
    phase.wall = time.perf_counter() - t0
    phase.rss_mb = server.rss_mb()
    return out


async def limit_probe(make, undo=None) -> dict:
    """What one call beyond a limit gets: the error's type and message, or ``accepted`` (then ``undo`` is
    awaited with what the call returned, to give the slot back)."""
    try:
        got = await make()
    except Exception as exc:
        return {"result": "refused", "error": type(exc).__name__, "message": str(exc)}
    if undo is not None:
        await undo(got)
    return {"result": "accepted", "error": None, "message": ""}
