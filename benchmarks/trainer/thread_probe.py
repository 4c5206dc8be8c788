"""Where an arm of ``marti bench trainer`` spends its CPU, per phase (generation, update) and per thread.

Standard library and ``psutil`` only: the TRL runner (:mod:`trl_runner`, TRL's own virtualenv, no ``marti``)
imports it as a plain module as well as our side (:mod:`benchmarks.trainer.ours`). psutil is a dependency of this
project and of accelerate (``Requires-Dist: psutil``), which TRL's virtualenv installs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

#: How many of a phase's busiest threads :meth:`ThreadProbe.report` lists.
TOP_THREADS = 4


@dataclass
class _Snapshot:
    """One reading: wall clock (s), the process's CPU (user + system s, every thread it ever ran) and each live
    thread's CPU (native thread id -> user + system s)."""

    wall: float
    cpu: float
    threads: dict[int, float]


@dataclass
class _Totals:
    """A phase's sums over every time it ran (seconds; ``per_thread``: native thread id -> CPU s)."""

    per_thread: dict[int, float] = field(default_factory=dict)
    main_ids: set[int] = field(default_factory=set)
    entries: int = 0
    wall: float = 0.0
    cpu: float = 0.0
    main: float = 0.0


class ThreadProbe:
    """Sums, per phase, the wall time and the CPU seconds (user + system) of every thread of this process.

    Each :meth:`begin` and :meth:`end` reads the process's and each live thread's CPU time (``psutil``: one
    ``/proc/self/stat`` and one ``/proc/self/task/*/stat`` per thread, a fraction of a millisecond) and files what
    ran since the previous reading under the innermost open phase: a phase begun inside another pauses the outer
    one, so a step's generation inside its "update" span is counted once, as generation. A thread that starts
    inside a phase counts from 0; one that ends inside it counts to its last reading, and the CPU it ran after
    that is still in ``cpu_s`` (read from the process, which keeps the CPU of its ended threads) as
    ``unattributed_cpu_s``. The kernel reports CPU time in clock ticks (10 ms), each reading rounded down, the
    process's and every thread's apart: a phase's figures are exact to about 10 ms per thread each time it ran
    (an error of up to one tick per reading, which over many steps can add up in either direction, as the
    readings at a phase's start and end are rounded alike), and ``unattributed_cpu_s`` also
    holds the difference between the process's and its threads' roundings.

    Example::

        probe = ThreadProbe()
        for step in steps:
            with probe.phase("generation"):
                generate()
            with probe.phase("update"):
                train()
        probe.report()["generation"]["cores_busy"]  # e.g. 1.9 with 2 torch threads
    """

    def __init__(self) -> None:
        import psutil

        self._process = psutil.Process()
        self._open: list[tuple[str, int]] = []
        self._last: _Snapshot | None = None
        self._totals: dict[str, _Totals] = {}
        self._names: dict[int, str | None] = {}

    def begin(self, name: str) -> None:
        """Open phase ``name`` (pausing the open one, if any) for the calling thread, its main thread."""
        self._file_since_last()
        self._open.append((name, threading.get_native_id()))
        self._totals.setdefault(name, _Totals()).entries += 1

    def end(self) -> None:
        """Close the innermost open phase (the outer one, if any, resumes).

        Raises:
            RuntimeError: No phase is open.
        """
        if not self._open:
            raise RuntimeError("ThreadProbe.end(): no phase is open (begin() was not called)")
        self._file_since_last()
        self._open.pop()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """:meth:`begin` ``name`` on entry, :meth:`end` on exit (also when the block raises)."""
        self.begin(name)
        try:
            yield
        finally:
            self.end()

    def _snapshot(self) -> _Snapshot:
        """Read the wall clock, the process's CPU and each live thread's CPU (seconds)."""
        cpu = self._process.cpu_times()
        threads = {t.id: t.user_time + t.system_time for t in self._process.threads()}
        return _Snapshot(time.perf_counter(), cpu.user + cpu.system, threads)

    def _file_since_last(self) -> None:
        """Take a reading and file what ran since the previous one under the innermost open phase."""
        now = self._snapshot()
        if self._open and self._last is not None:
            name, main_id = self._open[-1]
            self._add(self._totals[name], main_id, self._last, now)
        self._last = now

    def _add(self, totals: _Totals, main_id: int, before: _Snapshot, after: _Snapshot) -> None:
        """Add the span ``before`` -> ``after`` to a phase's totals; ``main_id`` is the thread that opened it."""
        for tid, cpu in after.threads.items():
            start = before.threads.get(tid, 0.0)
            used = cpu - start if cpu >= start else cpu  # less than before: the id was reused by a new thread
            if used > 0:
                totals.per_thread[tid] = totals.per_thread.get(tid, 0.0) + used
                if tid not in self._names:
                    self._names[tid] = _thread_name(tid)
        totals.wall += after.wall - before.wall
        totals.cpu += after.cpu - before.cpu
        totals.main += max(after.threads.get(main_id, 0.0) - before.threads.get(main_id, 0.0), 0.0)
        totals.main_ids.add(main_id)

    def report(self) -> dict[str, dict[str, Any]]:
        """Per phase, over every time it ran (seconds)::

            {phase: {"entries": times begun, "wall_s": wall time, "cpu_s": CPU of all threads,
                     "cores_busy": cpu_s / wall_s, "main_cpu_s": the thread that began the phase: Python,
                         plus its own part of each parallel torch op (OpenMP runs one part on the caller),
                     "other_cpu_s": cpu_s - main_cpu_s, at least 0 (OpenMP / intra-op workers and the rest),
                     "unattributed_cpu_s": CPU of threads that ended before a reading (part of other_cpu_s),
                     "threads": how many threads used CPU (those read at some boundary),
                     "top": [{"thread": name or None, "tid": native id, "main": bool, "cpu_s": s}, ...]}}

        ``top`` lists the :data:`TOP_THREADS` busiest threads, busiest first; ``cores_busy`` is 0 for a phase
        with no wall time.
        """
        out = {}
        for name, t in sorted(self._totals.items()):
            busiest = sorted(t.per_thread.items(), key=lambda kv: -kv[1])[:TOP_THREADS]
            out[name] = {
                "entries": t.entries,
                "wall_s": t.wall,
                "cpu_s": t.cpu,
                "cores_busy": t.cpu / t.wall if t.wall > 0 else 0.0,
                "main_cpu_s": t.main,
                "other_cpu_s": max(t.cpu - t.main, 0.0),
                "unattributed_cpu_s": max(t.cpu - sum(t.per_thread.values()), 0.0),
                "threads": len(t.per_thread),
                "top": [
                    {"thread": self._names.get(tid), "tid": tid, "main": tid in t.main_ids, "cpu_s": cpu}
                    for tid, cpu in busiest
                ],
            }
        return out


def _thread_name(tid: int) -> str | None:
    """The kernel's name of this process's thread ``tid`` (``/proc/self/task/<tid>/comm``); None if unreadable."""
    try:
        with open(f"/proc/self/task/{tid}/comm") as f:
            return f.read().strip()
    except OSError:
        return None
