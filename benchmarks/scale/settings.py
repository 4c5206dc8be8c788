"""The settings of ``marti bench scale``: the quick and full runs, the measurement constants and the issue's targets."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV_NAME = "resource_allocation"
#: Least growth per round (MB) that the leak check calls a leak: below it, allocator noise.
LEAK_FLOOR_MB = 2.0
#: Calls in flight at most while the idle phase creates, resets or joins (few request buffers live at once).
SETUP_CONCURRENCY = 32
#: Quiet seconds before an idle RSS reading, and reads per reading (the median is kept).
RSS_SETTLE_S = 1.0
RSS_SAMPLES = 5
#: The paced schedule wakes this much before a call's time (asyncio's timers and the task start add about a
#: millisecond); a call that starts early is timed from its actual start.
EARLY_S = 0.001
QUICK = {
    "sessions": 20, "agents": 20, "turns": 2, "messages": 3,
    "paced_rate": 40.0, "procs": 2, "paced_seconds": 2.0, "settle": 0.3,
}  # fmt: skip
FULL = {
    "sessions": 1000, "agents": 1000, "turns": 3, "messages": 10,
    "paced_rate": 200.0, "procs": 4, "paced_seconds": 20.0, "settle": RSS_SETTLE_S,
}  # fmt: skip
#: The issue's targets: p99 per paced call (ms), RSS per idle env session and per idle mailbox (KB).
P99_TARGET_MS = 10.0
SESSION_TARGET_KB = 50.0
MAILBOX_TARGET_KB = 20.0
