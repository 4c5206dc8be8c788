"""A reward report's answer tells the truth about its episodes: lost at close, failed in the sink, refused for
the backlog (before anything changes, and only when it would add to it), and what close loses without a report."""

from __future__ import annotations

import asyncio
import threading

import pytest

from marti.errors import (
    AbortedError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    RateLimitedError,
    ResourceExhaustedError,
    UnavailableError,
)
from services.gateway.core.gateway import Gateway
from services.gateway.core.limits import GatewayLimits
from services.gateway.http.common.errors import exception_response
from tests.unit.gateway.test_gateway_core import FakeBackend, S, _drained


async def test_a_report_whose_episodes_the_closing_gateway_did_not_insert_is_told_they_are_lost(caplog):
    """The report waits for its group's inserts; the gateway closes meanwhile: the sink in flight gives up (as
    the trainer's feed does on ``closing``; its error is logged) and the other member is never handed to it.
    The report is answered UNAVAILABLE naming both as lost to training, never as released."""
    handed: list[str] = []

    def sink(episode):
        handed.append(episode["a"].episode_id)
        assert gw.closing.wait(10), "the gateway never closed"
        raise UnavailableError("stopped waiting for room: the gateway is closing")

    gw = Gateway(FakeBackend(), GatewayLimits(max_wait_ms=0, report_wait_s=30), sink=sink)
    for e in ("e1", "e2"):
        await gw.generate("a", [1], S, episode_id=e, group_id="g")
    await gw.report("e1", {"a": 1.0}, group_size=2)
    report = asyncio.ensure_future(gw.report("e2", {"a": 1.0}, group_size=2))
    for _ in range(500):
        if handed:
            break
        await asyncio.sleep(0.01)
    with caplog.at_level("WARNING", logger="marti.gateway"):
        await asyncio.wait_for(gw.close(), timeout=8)
    assert "episode 'e1' is lost to training: the sink gave up as the gateway closed: stopped waiting" in (
        caplog.text
    )
    with pytest.raises(
        UnavailableError,
        match=r"shutting down: episodes \['e1', 'e2'\] this report released were not inserted into training "
        r"and are lost to it",
    ):
        await asyncio.wait_for(report, timeout=8)
    stats = gw.stats()
    assert handed == ["e1"]
    assert (stats["backlog_lost_at_close"], stats["released"], stats["sink_errors"]) == (2, 0, 0)
    assert exception_response(report.exception()).status_code == 503


async def test_a_sink_failure_within_the_wait_says_the_episode_is_lost_and_not_to_retry():
    """A full table the sink gave up on: the report is taken (a retry is refused as already reported), so the
    answer is ABORTED / HTTP 409 naming the sink's error and saying the episode is lost, not the table's 504."""

    def sink(episode):
        raise RateLimitedError("table 'job/a' is full (4/4 items)", table="job/a", size=4, max_size=4)

    gw = Gateway(FakeBackend(), GatewayLimits(max_wait_ms=0), sink=sink)
    await gw.generate("a", [1], S, episode_id="e1")
    with pytest.raises(AbortedError) as caught:
        await gw.report("e1", {"a": 1.0})
    message = str(caught.value)
    assert "episodes ['e1'] it released were not inserted into training" in message
    assert "RateLimitedError: table 'job/a' is full" in message
    assert "lost to training (gateway/sink_errors), so do not report them again" in message
    response = exception_response(caught.value)
    assert response.status_code == 409 and "retry-after" not in response.headers
    assert gw.stats()["sink_errors"] == 1
    with pytest.raises(FailedPreconditionError, match="already reported"):
        await gw.report("e1", {"a": 1.0})
    await gw.close()


async def test_a_sink_bug_stays_an_internal_error():
    def sink(episode):
        raise KeyError("secret detail")

    gw = Gateway(FakeBackend(), GatewayLimits(max_wait_ms=0), sink=sink)
    await gw.generate("a", [1], S, episode_id="e1")
    with pytest.raises(KeyError):
        await gw.report("e1", {"a": 1.0})
    await gw.close()


async def test_close_counts_and_logs_held_and_open_episodes(caplog):
    gw = Gateway(FakeBackend(), GatewayLimits(max_wait_ms=0), sink=lambda episode: None)
    for e in ("h1", "h2", "o1"):
        await gw.generate("a", [1], S, episode_id=e, group_id="g" if e != "o1" else "")
    await gw.report("h1", {"a": 1.0}, group_size=3)
    await gw.report("h2", {"a": 1.0}, group_size=3)
    assert (gw.stats()["held_lost_at_close"], gw.stats()["open_lost_at_close"]) == (0, 0)
    with caplog.at_level("WARNING", logger="marti.gateway"):
        await gw.close()
    stats = gw.stats()
    assert (stats["held_lost_at_close"], stats["open_lost_at_close"]) == (2, 1)
    assert "closing with 2 finished episodes held for their incomplete groups" in caplog.text
    assert "1 episodes not reported yet" in caplog.text


async def test_a_report_releasing_more_than_the_backlog_has_room_for_is_refused_before_changing_anything():
    """Backlog limit 2 with 1 waiting: completing a group of 2 would make 3, so it is refused and its member stays
    open; after the backlog drained the same report releases the group. A group larger than the limit is taken
    while the backlog is empty (it could never be taken otherwise)."""
    room = threading.Event()
    inserted: list[str] = []

    def sink(episode):
        assert room.wait(10), "the test never made room"
        inserted.append(episode["a"].episode_id)

    limits = GatewayLimits(max_wait_ms=0, max_backlog_episodes=2, report_wait_s=0.1)
    gw = Gateway(FakeBackend(), limits, sink=sink)
    await gw.generate("a", [1], S, episode_id="x1")
    for e in ("g1", "g2"):
        await gw.generate("a", [1], S, episode_id=e, group_id="g")
    assert (await gw.report("x1", {"a": 1.0})).queued == 1
    assert (await gw.report("g1", {"a": 1.0}, group_size=2)).episodes == []  # held: adds nothing
    with pytest.raises(ResourceExhaustedError, match="1 released episodes are waiting.*would release 2 more"):
        await gw.report("g2", {"a": 1.0}, group_size=2)
    stats = gw.stats()
    assert (stats["backlog"], stats["held"], stats["open_episodes"], stats["backlog_refused"]) == (1, 1, 1, 1)
    room.set()
    await _drained(gw)
    assert len((await gw.report("g2", {"a": 1.0}, group_size=2)).episodes) == 2
    assert inserted == ["x1", "g1", "g2"]
    for e in ("b1", "b2", "b3"):  # a group of 3 > the limit of 2, while nothing waits
        await gw.generate("a", [1], S, episode_id=e, group_id="big")
    for e in ("b1", "b2"):
        await gw.report(e, {"a": 1.0}, group_size=3)
    assert len((await gw.report("b3", {"a": 1.0}, group_size=3)).episodes) == 3
    await gw.close()


async def test_a_full_backlog_still_answers_invalid_reports_with_their_own_error_and_takes_failed_ones():
    room = threading.Event()

    def sink(episode):
        assert room.wait(10), "the test never made room"

    limits = GatewayLimits(max_wait_ms=0, max_backlog_episodes=1, report_wait_s=0.1)
    gw = Gateway(FakeBackend(), limits, sink=sink)
    for e in ("e1", "e2", "e3"):
        await gw.generate("a", [1], S, episode_id=e)
    assert (await gw.report("e1", {"a": 1.0})).queued == 1  # the backlog is full
    with pytest.raises(NotFoundError, match="'nope' has no recorded calls"):
        await gw.report("nope", {"a": 1.0})
    with pytest.raises(InvalidArgumentError, match="'zed', which is not a trained agent"):
        await gw.report("e2", {"zed": 1.0})
    assert (await gw.report("e2", {"a": 0.0}, failed=True)).dropped == 1  # adds nothing to the backlog
    with pytest.raises(ResourceExhaustedError):
        await gw.report("e3", {"a": 1.0})
    assert gw.stats()["backlog_refused"] == 1
    room.set()
    await _drained(gw)
    await gw.close()
