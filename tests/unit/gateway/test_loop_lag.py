"""The event-loop lag probe: a loop blocked by the gateway's own code shows in its samples."""

from __future__ import annotations

import asyncio
import time

import pytest

from marti.errors import InvalidArgumentError
from services.gateway.core.loop_lag import LoopLagProbe


async def test_a_blocked_loop_shows_as_lag_and_reset_forgets_it():
    probe = LoopLagProbe(interval_s=0.01, window=100)
    assert probe.stats()["loop_lag_samples"] == 0 and probe.stats()["loop_lag_ms_max"] == 0
    task = asyncio.ensure_future(probe.run())
    await asyncio.sleep(0.05)
    time.sleep(0.2)  # blocking code on the loop: the probe's sleep ends ~0.2 s late
    await asyncio.sleep(0.05)
    stats = probe.stats()
    assert stats["loop_lag_samples"] >= 3
    assert 150 <= stats["loop_lag_ms_max"] < 1000, stats
    assert stats["loop_lag_ms_p50"] < 50, stats  # the other samples were on time
    probe.reset()
    await asyncio.sleep(0.05)
    assert probe.stats()["loop_lag_ms_max"] < 150
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


@pytest.mark.parametrize(("kwargs", "name"), [({"interval_s": 0}, "interval_s"), ({"window": 0}, "window")])
def test_bad_settings_are_refused_by_name(kwargs, name):
    with pytest.raises(InvalidArgumentError, match=name):
        LoopLagProbe(**kwargs)
