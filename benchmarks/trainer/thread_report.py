"""The second table of ``marti bench trainer``'s report (:mod:`benchmarks.trainer`): where each side's time goes,
per phase and per thread, from its :class:`~benchmarks.trainer.thread_probe.ThreadProbe` report."""

from __future__ import annotations

from typing import Any

from benchmarks.report import markdown_table

#: The phases both sides record, listed first and in this order (any other phase follows, sorted).
PHASES = ("generation", "update")

TITLE = "Where the time goes, per thread (each side's process, CPU = user + system seconds, all steps):"


def _phase_cells(side: str, phase: str, p: dict[str, Any], steps: int, samples: int) -> list[str]:
    """One row of :func:`format_thread_table`: a side's phase, per step and per sample."""
    share = p["main_cpu_s"] / p["cpu_s"] if p["cpu_s"] > 0 else 0.0
    return [
        side, phase, f"{p['wall_s'] / steps:.3f}", f"{p['cpu_s'] / steps:.3f}", f"{p['cores_busy']:.2f}",
        f"{share:.0%}", f"{p['other_cpu_s'] / steps:.3f}", str(p["threads"]), f"{p['cpu_s'] / samples:.4f}",
    ]  # fmt: skip


def _busiest(side: str, phase: str, p: dict[str, Any]) -> str:
    """The line naming a side's phase's busiest threads and their CPU seconds over all steps."""
    named = [
        f"{t['thread'] or 'tid ' + str(t['tid'])}{' (main)' if t['main'] else ''} {t['cpu_s']:.2f} s"
        for t in p["top"]
    ]
    ended = f"; {p['unattributed_cpu_s']:.2f} s not attributed (threads that ended, rounding)"
    return f"- {side} {phase}: busiest threads {', '.join(named) or 'none'}{ended}"


def format_thread_table(rows: list[dict[str, Any]], threads: int) -> str:
    """The per-thread table: per side (:func:`benchmarks.trainer.report.summarize` rows) and phase, wall and CPU
    seconds per step, cores busy (CPU / wall, of ``threads`` torch threads), the main (Python) thread's share of
    the CPU, the other threads' CPU per step, how many threads used CPU, and CPU seconds per sample; then the
    busiest threads of each. A side whose result file has no ``threads`` (older than the probe) gets one row,
    "not measured"."""
    header = ["side", "phase", "wall s / step", "CPU s / step", f"cores busy (of {threads})",
              "main thread (Python) share", "other threads CPU s / step", "threads", "CPU s / sample"]  # fmt: skip
    cells, notes = [], []
    for r in rows:
        measured = r.get("threads")
        if not measured:
            cells.append([r["side"], "not measured", *[""] * 7])
            continue
        for phase in [*(p for p in PHASES if p in measured), *sorted(set(measured) - set(PHASES))]:
            cells.append(_phase_cells(r["side"], phase, measured[phase], r["steps"], r["samples"]))
            notes.append(_busiest(r["side"], phase, measured[phase]))
    return "\n".join([TITLE, "", markdown_table(header, cells, "ll" + "r" * 7), "", *notes])
