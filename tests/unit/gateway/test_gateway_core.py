"""The gateway facade over a fake backend: model names, limits, in-flight calls, reports and the sink."""

from __future__ import annotations

import asyncio
import threading

import pytest

from marti.errors import (
    AbortedError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    UnavailableError,
)
from marti.types.inference import Generation, SamplingParams
from services.gateway.core.backend import InferenceBackend
from services.gateway.core.gateway import INLINE_IDS, Gateway
from services.gateway.core.limits import GatewayLimits

S = SamplingParams(max_new_tokens=2)


class FakeBackend(InferenceBackend):
    """One agent ``a`` (version 0 resident); tokens are characters' code points mod 100; echoes last id + 1."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.gate = gate
        self.encode_threads: list[int] = []
        self.batches: list[int] = []
        self.fail = False

    def agents(self):
        return ["a"]

    def versions(self):
        return {"a": 0}

    def resident_versions(self, agent):
        return [0]

    def chat_prompt(self, agent, messages):
        return self.encode(agent, "".join(m["content"] for m in messages))

    def encode(self, agent, text):
        self.encode_threads.append(threading.get_ident())
        return [ord(c) % 100 for c in text]

    def token_texts(self, agent, ids):
        return [str(i) for i in ids]

    def decode(self, agent, ids):
        return " ".join(str(i) for i in ids)

    def vocab_size(self, agent):
        return 100

    def max_model_len(self, agent):
        return 64

    def generate(self, agent, prompts, sampling, version):
        if self.gate is not None:
            self.gate.wait(10)
        self.batches.append(len(prompts))
        if self.fail:
            raise UnavailableError("engine down")
        return [Generation(p, [p[-1] + 1], [-1.0], "t", "stop", version or 0, agent) for p in prompts]


def test_only_ascii_digits_name_a_version():
    gw = Gateway(FakeBackend())
    assert gw.resolve("a@0") == ("a", 0)
    for bad in (
        "a@²",
        "a@٠",
        "a@0x",
        "a@",
        "a@00",
    ):  # a superscript two was a 500, an Arabic-Indic zero was version 0; a@00 was served but not listed
        with pytest.raises(NotFoundError, match="not resident"):
            gw.resolve(bad)


async def test_the_prompt_is_tokenized_off_the_event_loop():
    backend = FakeBackend()
    gw = Gateway(backend)
    await gw.generate("a", "hello", S)
    await gw.generate("a", [{"role": "user", "content": "hi"}], S)
    assert backend.encode_threads and threading.get_ident() not in backend.encode_threads
    await gw.close()


async def test_token_ids_are_checked_on_the_loop_without_a_thread_hop_unless_long():
    """A prompt given as token ids (what the chat adapters pass after rendering) needs no tokenizer: its ids are
    checked on the event loop, saving a thread hop per call; a list longer than INLINE_IDS goes to a thread."""
    threads: list[int] = []

    class Recording(FakeBackend):
        def vocab_size(self, agent):
            threads.append(threading.get_ident())
            return 100

    gw = Gateway(Recording())
    await gw.generate("a", [5, 6, 7], S)
    assert threads == [threading.get_ident()]
    with pytest.raises(InvalidArgumentError, match="context"):
        await gw.generate("a", [5] * (INLINE_IDS + 1), S)
    assert threads[1] != threading.get_ident()
    await gw.close()


async def test_n_beyond_the_remaining_call_budget_is_refused_before_generating():
    backend = FakeBackend()
    gw = Gateway(backend, GatewayLimits(max_calls_per_episode=3, max_wait_ms=0))
    await gw.generate("a", [1], S, n=2, episode_id="e")
    with pytest.raises(InvalidArgumentError, match="has 2 calls .* adds 2;.*max_calls_per_episode"):
        await gw.generate("a", [1], S, n=2, episode_id="e")
    assert backend.batches == [2] and gw.stats()["calls"] == 2
    await gw.generate("a", [1], S, n=1, episode_id="e")  # exactly the limit
    assert gw.stats()["calls"] == 3
    await gw.close()


async def test_a_call_in_flight_holds_its_episode_open_and_its_report_is_refused_until_it_returns():
    gate = threading.Event()
    gw = Gateway(FakeBackend(gate), GatewayLimits(max_open_episodes=1, max_wait_ms=0))
    call = asyncio.ensure_future(gw.generate("a", [1], S, episode_id="e", group_id="g"))
    await asyncio.sleep(0.05)
    assert gw.stats()["open_episodes"] == 1
    with pytest.raises(ResourceExhaustedError, match="max_open_episodes"):  # the first call opened e
        await gw.generate("a", [1], S, episode_id="other")
    with pytest.raises(FailedPreconditionError, match="1 calls of episode 'e' are still running"):
        await gw.report("e", {"a": 1.0})
    gw.tracker.episode_timeout_s = 0.001
    assert gw.tracker.sweep().dropped == 0  # never abandoned while its call runs
    gw.tracker.episode_timeout_s = 600.0
    gate.set()
    served = await call
    assert len((await gw.report("e", {"a": 1.0})).episodes) == 1
    assert served.call_ids and gw.stats()["released"] == 1
    await gw.close()


async def test_a_failed_call_leaves_no_open_episode_and_its_report_is_not_found():
    backend = FakeBackend()
    backend.fail = True
    gw = Gateway(backend, GatewayLimits(max_wait_ms=0))
    with pytest.raises(UnavailableError):
        await gw.generate("a", [1], S, episode_id="e")
    assert gw.stats()["open_episodes"] == 0
    with pytest.raises(NotFoundError, match="'e' has no recorded calls"):
        await gw.report("e", {"a": 1.0})
    await gw.close()


async def test_stop_string_and_id_limits_are_enforced_by_name():
    gw = Gateway(FakeBackend(), GatewayLimits(max_stop=2, max_stop_chars=3, max_id_chars=5, max_wait_ms=0))
    await gw.generate("a", [1], SamplingParams(max_new_tokens=2, stop=("abc", "d")), episode_id="abcde")
    with pytest.raises(InvalidArgumentError, match=r"3 stop strings.*gateway\.max_stop\) is 2"):
        await gw.generate("a", [1], SamplingParams(max_new_tokens=2, stop=("a", "b", "c")))
    with pytest.raises(InvalidArgumentError, match=r"stop string 1 has 4 characters.*max_stop_chars\) is 3"):
        await gw.generate("a", [1], SamplingParams(max_new_tokens=2, stop=("a", "abcd")))
    with pytest.raises(InvalidArgumentError, match=r"episode_id has 6 characters.*max_id_chars\) is 5"):
        await gw.generate("a", [1], S, episode_id="abcdef")
    with pytest.raises(InvalidArgumentError, match="group_id has 6"):
        await gw.generate("a", [1], S, episode_id="e", group_id="abcdef")
    with pytest.raises(InvalidArgumentError, match="'a/b' contains '/'"):
        await gw.generate("a", [1], S, episode_id="a/b")
    for bad in ("a\x00b", "a\nb", "a\x7f"):  # a %00 in a path id was accepted
        with pytest.raises(InvalidArgumentError, match="control character U\\+00"):
            await gw.generate("a", [1], S, episode_id=bad)
    with pytest.raises(InvalidArgumentError, match="idempotency_key.*U\\+0009"):
        await gw.generate("a", [1], S, episode_id="e", idempotency_key="k\t")
    with pytest.raises(InvalidArgumentError, match="episode_id has 6"):
        await gw.report("abcdef", {})
    with pytest.raises(InvalidArgumentError, match="group_id 'g/1' contains '/'"):
        await gw.report("abcde", {}, group_id="g/1")
    assert gw.stats()["calls"] == 1 and gw.stats()["open_episodes"] == 1
    await gw.close()


async def test_every_member_of_a_released_group_is_offered_to_the_sink_and_failures_are_counted():
    tried = []

    def sink(episode):
        eid = episode["a"].episode_id
        tried.append(eid)
        if eid in ("e2", "e3"):
            raise UnavailableError(f"store down for {eid}")

    gw = Gateway(FakeBackend(), GatewayLimits(max_wait_ms=0), sink=sink)
    for e in ("e1", "e2", "e3"):
        await gw.generate("a", [1], S, episode_id=e, group_id="g")
    await gw.report("e1", {"a": 1.0}, group_size=3)
    await gw.report("e2", {"a": 1.0}, group_size=3)
    with pytest.raises(AbortedError, match=r"\['e2', 'e3'\].*store down for e2.*inserted: \['e1'\]"):
        await gw.report("e3", {"a": 1.0}, group_size=3)
    stats = gw.stats()
    assert tried == ["e1", "e2", "e3"]
    assert stats["released"] == 1 and stats["sink_errors"] == 2
    await gw.close()


async def test_stats_name_held_and_expired_groups():
    gw = Gateway(FakeBackend(), GatewayLimits(max_wait_ms=0))
    await gw.generate("a", [1], S, episode_id="e1", group_id="g")
    await gw.report("e1", {"a": 1.0}, group_size=2)
    stats = gw.stats()
    assert stats["held"] == 1 and stats["expired_groups"] == 0 and stats["released"] == 0
    await gw.close()


def test_a_bad_episode_timeout_names_its_real_config_key():
    with pytest.raises(InvalidArgumentError, match=r"^external\.episode_timeout_s must be > 0"):
        GatewayLimits(episode_timeout_s=0)


async def test_calls_cancelled_while_queued_are_never_generated_unless_a_retry_can_wait_for_them():
    """A caller that goes away (a gRPC deadline or cancel) while its call is still queued costs the engine nothing,
    traced or not; a call with an idempotency key keeps its place, as a retry may be waiting for it."""
    gate = threading.Event()
    backend = FakeBackend(gate)
    gw = Gateway(backend, GatewayLimits(max_wait_ms=0))
    running = asyncio.ensure_future(gw.generate("a", [1], S))
    await asyncio.sleep(0.05)  # in the engine, held by the gate
    untraced = asyncio.ensure_future(gw.generate("a", [2], S, n=2))
    traced = asyncio.ensure_future(gw.generate("a", [3], S, n=3, episode_id="e1"))
    keyed = asyncio.ensure_future(gw.generate("a", [4], S, n=4, episode_id="e2", idempotency_key="k"))
    await asyncio.sleep(0.05)  # queued behind the running batch
    for task in (untraced, traced, keyed):
        task.cancel()
    retry = asyncio.ensure_future(gw.generate("a", [4], S, n=4, episode_id="e2", idempotency_key="k"))
    await asyncio.sleep(0.05)  # the retry waits for the keyed call
    gate.set()
    await running
    assert len((await retry).generations) == 4
    assert sorted(backend.batches) == [1, 4]  # the running call and the keyed one only
    stats = gw.stats()
    assert stats["unrecorded_disconnected"] == 1 and stats["calls"] == 4 and stats["replayed_calls"] == 1
    assert gw.batcher.dropped_prompts == 5 and gw.tracker.open_episodes == 1  # e1 was never opened for good
    await gw.close()


async def _drained(gw: Gateway) -> None:
    """Wait (generously) until the gateway's backlog is empty."""
    for _ in range(1000):
        if gw.stats()["backlog"] == 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the backlog never drained: {gw.stats()}")


async def test_a_report_whose_insert_blocks_is_answered_as_queued_and_a_full_backlog_refuses_without_changes():
    """A sink blocked on a full table: each report is answered after gateway.report_wait_s with its episode
    queued; once gateway.max_backlog_episodes wait, a report is refused before it changes anything (the episode
    stays open) and succeeds when reported again after the backlog drained, in report order."""
    room = threading.Event()
    inserted: list[str] = []

    def sink(episode):
        assert room.wait(10), "the test never made room"
        inserted.append(episode["a"].episode_id)

    limits = GatewayLimits(max_wait_ms=0, max_backlog_episodes=2, report_wait_s=0.2)
    gw = Gateway(FakeBackend(), limits, sink=sink)
    for e in ("e1", "e2", "e3"):
        await gw.generate("a", [1], S, episode_id=e)
    first = await asyncio.wait_for(gw.report("e1", {"a": 1.0}), timeout=8)  # not the sink's 10 s wait
    assert (len(first.episodes), first.queued) == (1, 1)
    second = await asyncio.wait_for(gw.report("e2", {"a": 1.0}), timeout=8)
    assert second.queued == 1
    stats = gw.stats()
    assert (stats["backlog"], stats["queued_reports"], stats["released"], stats["open_episodes"]) == (
        2,
        2,
        0,
        1,
    )
    with pytest.raises(
        ResourceExhaustedError,
        match=r"2 released episodes are waiting.*\(gateway\.max_backlog_episodes\) is 2",
    ):
        await gw.report("e3", {"a": 1.0})
    stats = gw.stats()
    assert stats["backlog_refused"] == 1 and stats["open_episodes"] == 1 and stats["finished"] == 2
    room.set()
    await _drained(gw)
    assert inserted == ["e1", "e2"] and gw.stats()["released"] == 2
    third = await gw.report("e3", {"a": 1.0})  # the refused report, again: the episode was left open
    assert (len(third.episodes), third.queued) == (1, 0) and inserted == ["e1", "e2", "e3"]
    assert gw.stats()["backlog_lost_at_close"] == 0
    await gw.close()
    assert gw.stats()["backlog_lost_at_close"] == 0


async def test_a_report_with_a_sink_is_validated_once(monkeypatch):
    """The backlog check runs inside the tracker's ``finish`` (its ``admit`` hook), after the one validation."""
    gw = Gateway(FakeBackend(), GatewayLimits(max_wait_ms=0), sink=lambda episode: None)
    await gw.generate("a", [1], S, episode_id="e1")
    checked: list[str] = []
    check = gw.tracker._check_report
    monkeypatch.setattr(gw.tracker, "_check_report", lambda *a: (checked.append(a[0]), check(*a))[1])
    assert len((await gw.report("e1", {"a": 1.0})).episodes) == 1
    assert checked == ["e1"]
    await gw.close()


async def test_close_counts_and_logs_the_backlog_it_did_not_insert(caplog):
    """Closing with episodes still queued: the sink in flight gives up on ``closing`` (as the trainer's feed
    does), the rest are never handed to it; all are counted in backlog_lost_at_close and logged, none as
    released or as sink errors."""
    calls: list[str] = []

    def sink(episode):
        calls.append(episode["a"].episode_id)
        assert gw.closing.wait(10), "the gateway never closed"
        raise UnavailableError("stopped waiting for room: the gateway is closing")

    gw = Gateway(FakeBackend(), GatewayLimits(max_wait_ms=0, report_wait_s=0.1), sink=sink)
    for e in ("e1", "e2", "e3"):
        await gw.generate("a", [1], S, episode_id=e)
        assert (await asyncio.wait_for(gw.report(e, {"a": 1.0}), timeout=8)).queued == 1
    assert gw.stats()["backlog"] == 3
    with caplog.at_level("ERROR", logger="marti.gateway"):
        await asyncio.wait_for(gw.close(), timeout=8)
    stats = gw.stats()
    assert calls == ["e1"]  # e2 and e3 were never handed to the sink
    assert (stats["backlog_lost_at_close"], stats["backlog"], stats["released"], stats["sink_errors"]) == (
        3,
        0,
        0,
        0,
    )
    assert "3 released episodes were still waiting to be inserted when the gateway closed" in caplog.text
    with pytest.raises(UnavailableError, match="shutting down"):
        await gw.report("e9", {"a": 1.0})


def test_backlog_limits_are_validated_by_key():
    with pytest.raises(InvalidArgumentError, match=r"gateway\.max_backlog_episodes must be an int > 0"):
        GatewayLimits(max_backlog_episodes=0)
    with pytest.raises(InvalidArgumentError, match=r"gateway\.report_wait_s must be a finite number >= 0"):
        GatewayLimits(report_wait_s=-1)


async def test_a_queued_episode_whose_insert_fails_later_is_counted_in_sink_errors():
    """Nobody receives the error of an insert that ends after its report was answered: it is counted in
    sink_errors (the episode is lost to training) and the backlog still drains."""
    room = threading.Event()

    def sink(episode):
        assert room.wait(10), "the test never made room"
        raise UnavailableError("the experience store is unavailable")

    gw = Gateway(FakeBackend(), GatewayLimits(max_wait_ms=0, report_wait_s=0.1), sink=sink)
    await gw.generate("a", [1], S, episode_id="e1")
    assert (await asyncio.wait_for(gw.report("e1", {"a": 1.0}), timeout=8)).queued == 1
    room.set()
    await _drained(gw)
    stats = gw.stats()
    assert (stats["sink_errors"], stats["released"], stats["backlog_lost_at_close"]) == (1, 0, 0)
    await gw.close()


async def test_close_does_not_wait_for_a_sink_that_ignores_closing(monkeypatch):
    """A sink that does not watch ``closing`` holds close for at most CLOSE_DELIVERY_WAIT_S; every backlog episode
    is then counted lost, and the sink's late success does not count it as released too."""
    from services.gateway.core import delivery as delivery_mod

    monkeypatch.setattr(delivery_mod, "CLOSE_DELIVERY_WAIT_S", 0.2)
    release = threading.Event()

    def sink(episode):
        release.wait(10)

    gw = Gateway(FakeBackend(), GatewayLimits(max_wait_ms=0, report_wait_s=0.05), sink=sink)
    for e in ("e1", "e2"):
        await gw.generate("a", [1], S, episode_id=e)
        assert (await asyncio.wait_for(gw.report(e, {"a": 1.0}), timeout=8)).queued == 1
    await asyncio.wait_for(gw.close(), timeout=8)  # not the sink's 10 s
    stats = gw.stats()
    assert (stats["backlog_lost_at_close"], stats["backlog"], stats["released"]) == (2, 0, 0)
    release.set()
    for _ in range(200):  # the sink's thread returns; its outcome is not counted
        if not gw.delivery.tasks:
            break
        await asyncio.sleep(0.01)
    stats = gw.stats()
    assert (stats["backlog_lost_at_close"], stats["backlog"], stats["released"]) == (2, 0, 0)


async def test_duplicates_sent_at_the_same_moment_share_one_call_under_their_idempotency_key():
    """The key is taken before anything is awaited (tokenising happens off the loop): requests with the same key
    sent together generate and record once and all get the first call's ids; one with another group is refused."""
    backend = FakeBackend()
    gw = Gateway(backend, GatewayLimits(max_wait_ms=0))
    served = await asyncio.gather(
        *(gw.generate("a", "hello", S, episode_id="e", group_id="g", idempotency_key="k") for _ in range(6))
    )
    assert {tuple(s.call_ids) for s in served} == {tuple(served[0].call_ids)}
    stats = gw.stats()
    assert stats["calls"] == 1 and stats["replayed_calls"] == 5 and backend.batches == [1]
    with pytest.raises(FailedPreconditionError, match="'k'"):
        await gw.generate("a", "hello", S, episode_id="e", group_id="other", idempotency_key="k")
    bad = await asyncio.gather(
        *(gw.generate("a", "x" * 70, S, episode_id="e", idempotency_key="long") for _ in range(3)),
        return_exceptions=True,
    )  # a prompt too long for the model: every duplicate gets the error, and the key is free again
    assert all(isinstance(b, InvalidArgumentError) for b in bad), bad
    assert ("e", "long") not in gw._replays
    await gw.close()
