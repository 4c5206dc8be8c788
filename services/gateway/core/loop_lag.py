"""The gateway's event-loop lag: how late the loop runs what is due, measured from inside the loop.

A gateway whose loop is saturated (too much work per request, or blocking code on the loop) answers late even
when the engine is idle; the lag says so directly. :class:`LoopLagProbe` sleeps ``interval_s`` over and over on
the loop it runs on; each wake-up later than asked is one sample of the lag (the oversleep, seconds). The
gateway runs one (:meth:`services.gateway.core.gateway.Gateway.start`) and reports its recent samples in
``GET /v1/gateway/stats`` as ``loop_lag_ms_p50``, ``loop_lag_ms_p99`` and ``loop_lag_ms_max``.
"""

from __future__ import annotations

import asyncio
import collections
import statistics

from marti.errors import InvalidArgumentError

#: Seconds between two probes by default.
DEFAULT_INTERVAL_S = 0.05
#: Samples kept by default (at the default interval: the last minute).
DEFAULT_WINDOW = 1200


class LoopLagProbe:
    """Samples the lag of the event loop :meth:`run` runs on.

    Args:
        interval_s: Seconds asked of each sleep, > 0.
        window: Most recent samples kept (the statistics are over them), > 0.

    Raises:
        InvalidArgumentError: ``interval_s`` or ``window`` not positive.
    """

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S, window: int = DEFAULT_WINDOW) -> None:
        if not interval_s > 0:
            raise InvalidArgumentError(f"interval_s must be > 0, got {interval_s!r}")
        if not isinstance(window, int) or window <= 0:
            raise InvalidArgumentError(f"window must be an int > 0, got {window!r}")
        self.interval_s = interval_s
        self._samples: collections.deque[float] = collections.deque(maxlen=window)

    async def run(self) -> None:
        """Probe until cancelled: sleep ``interval_s``, record how much later than that the loop woke up."""
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(self.interval_s)
            self._samples.append(max(0.0, loop.time() - start - self.interval_s))

    def reset(self) -> None:
        """Forget the samples taken so far (a benchmark's arm starts from here)."""
        self._samples.clear()

    def stats(self) -> dict[str, float]:
        """Over the kept samples: ``loop_lag_ms_p50``, ``loop_lag_ms_p99``, ``loop_lag_ms_max`` (milliseconds;
        0 before the first sample) and ``loop_lag_samples`` (how many)."""
        lags = sorted(self._samples)
        if not lags:
            return dict.fromkeys(
                ("loop_lag_ms_p50", "loop_lag_ms_p99", "loop_lag_ms_max", "loop_lag_samples"), 0.0
            )
        return {
            "loop_lag_ms_p50": statistics.median(lags) * 1e3,
            "loop_lag_ms_p99": lags[min(len(lags) - 1, round(0.99 * (len(lags) - 1)))] * 1e3,
            "loop_lag_ms_max": lags[-1] * 1e3,
            "loop_lag_samples": float(len(lags)),
        }
