"""The event-loop lag probe: a loop blocked by the gateway's own code shows in its samples."""

from __future__ import annotations

import asyncio
import time

import pytest
from waits import until_async

from marti.errors import InvalidArgumentError
from services.gateway.core.loop_lag import LoopLagProbe


async def test_a_blocked_loop_shows_as_lag_and_reset_forgets_it():
    """A block of 0.5 s is one sample of about 0.5 s among samples on time (a loaded machine makes them late by
    far less than 0.25 s); each phase ends on a count of samples, not after a fixed sleep."""
    probe = LoopLagProbe(interval_s=0.01, window=100)
    assert probe.stats()["loop_lag_samples"] == 0 and probe.stats()["loop_lag_ms_max"] == 0
    task = asyncio.ensure_future(probe.run())
    samples = lambda: probe.stats()["loop_lag_samples"]  # noqa: E731
    await until_async(lambda: samples() >= 2, "2 samples before the block")
    time.sleep(0.5)  # blocking code on the loop: the probe's sleep ends ~0.5 s late
    await until_async(lambda: samples() >= 7, "samples after the block")
    stats = probe.stats()
    assert 400 <= stats["loop_lag_ms_max"] < 5000, stats
    assert stats["loop_lag_ms_p50"] < 250, stats  # the other samples were on time
    probe.reset()
    await until_async(lambda: samples() >= 1, "a sample after the reset")
    assert probe.stats()["loop_lag_ms_max"] < 400
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


@pytest.mark.parametrize(("kwargs", "name"), [({"interval_s": 0}, "interval_s"), ({"window": 0}, "window")])
def test_bad_settings_are_refused_by_name(kwargs, name):
    with pytest.raises(InvalidArgumentError, match=name):
        LoopLagProbe(**kwargs)
