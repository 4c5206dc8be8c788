"""``marti bench scale`` end to end in ``--quick`` mode against a real env server and broker: the plumbing
(every session succeeds, every message arrives once, the caps answer with the typed error, the paced phase's
counts add up, the idle-memory readings exist), not the speed or the memory targets."""

from __future__ import annotations

import asyncio
import json
import time

from benchmarks import scale
from benchmarks.scale import broker_burst, env_burst, paced, paced_worker, servers, settings


def test_quick_run_at_the_limits_writes_every_number(tmp_path, capsys):
    out = tmp_path / "scale.json"
    argv = ["--quick", "--at-limit", "--env-rounds", "2", "--json", str(out)]
    assert scale.main(argv) == 0
    data = json.loads(out.read_text())
    n_sessions, n_agents = settings.QUICK["sessions"], settings.QUICK["agents"]
    turns, messages = settings.QUICK["turns"], settings.QUICK["messages"]
    assert data["checks_failed"] == []
    assert data["servers_alive"] == {
        "env_server": True, "comm_broker": True,
        "env_server (idle, paced)": True, "comm_broker (idle, paced)": True,
    }  # fmt: skip

    env = data["env_server"]
    assert len(env["rounds"]) == 2
    for rd in env["rounds"]:
        assert rd["sessions_ok"] == n_sessions
        phases = rd["phases"]
        assert set(phases) == {"create", "reset", "step", "batch", "close"}
        for key in ("create", "reset", "close"):
            assert phases[key]["ok"] == n_sessions and phases[key]["errors"] == 0
        for key in ("step", "batch"):
            assert phases[key]["ok"] == phases[key]["count"] == n_sessions * turns
        for p in phases.values():
            assert p["p99_ms"] >= p["p50_ms"] > 0 and p["rss_mb"] > 0
        assert rd["rss_mb"]["after_step"] > 0 and rd["rss_mb"]["after_close"] > 0
    first = env["rounds"][0]
    assert first["at_limit"]["result"] == "refused"
    assert first["at_limit"]["error"] == "ResourceExhaustedError"
    assert f"max_sessions={n_sessions}" in first["at_limit"]["message"]
    assert first["slot_freed_after_close"] is True
    assert set(env["leak_check"]) >= {"returned_near_baseline", "leak_suspected", "growth_mb"}

    broker = data["comm_broker"]
    assert broker["sent"] == broker["delivered"] == n_agents * messages
    assert broker["lost"] == 0 and broker["problems"] == {} and broker["agents_ok"] == n_agents
    stats = broker["broker_stats"]
    assert stats["sent"] == stats["delivered"] == stats["acked"] == n_agents * messages
    assert stats["agents"] == n_agents and stats["pending"] == 0
    assert broker["at_limit"]["error"] == "ResourceExhaustedError"
    assert f"max_agents_per_session={n_agents}" in broker["at_limit"]["message"]
    exchange = broker["phases"]["exchange"]
    assert exchange["count"] == broker["delivered"] and exchange["p99_ms"] >= exchange["p50_ms"] > 0

    # --at-limit passes the caps as flags, exactly N.
    passed = {(lim["service"], lim["name"]): lim["value"] for lim in data["limits"]}
    assert passed[("env_server", "max_sessions")] == n_sessions
    assert passed[("comm_broker", "max_agents_per_session")] == n_agents
    assert len(data["loadavg_before"]) == len(data["loadavg_after"]) == 3

    # The paced phase: every scheduled call of both services ran, none failed, from QUICK's processes.
    paced = data["paced"]
    rate, procs, seconds = (
        settings.QUICK["paced_rate"],
        settings.QUICK["procs"],
        settings.QUICK["paced_seconds"],
    )
    assert paced["worker_failures"] == [] and paced["procs"] == procs
    for key in ("env", "broker"):
        x = paced[key]
        assert abs(x["scheduled"] - rate * seconds) <= procs
        assert x["ok"] == x["scheduled"] and x["errors"] == 0 and x["errors_by_type"] == {}
        assert x["max_ms"] >= x["p99_ms"] >= x["p50_ms"] > 0
        assert x["service_p99_ms"] > 0 and x["late_max_ms"] >= x["late_p99_ms"]
        assert x["achieved_per_s"] > 0 and x["offered_per_s"] == x["scheduled"] / seconds
    assert paced["broker"]["extra"].get("unexpected", 0) == 0
    assert paced["env"]["over_target"] == sum(paced["env"]["over_target_by_second"])
    assert len(paced["env"]["over_target_by_second"]) == int(seconds)
    cores = data["paced_cores_by_second"]
    assert set(cores) == {"env", "broker", "clients", "machine"} and len(cores["machine"]) >= int(seconds)
    # Memory per idle session / mailbox: both readings and the quotient, each against its target.
    for key in ("env", "broker"):
        idle = data["idle_memory"][key]
        assert idle["ok"] == idle["n"] and idle["errors"] == {}
        assert (
            idle["rss_before"]["median_mb"] > 0
            and len(idle["rss_idle"]["samples_mb"]) == settings.RSS_SAMPLES
        )
        assert isinstance(idle["per_item_kb"], float)
        assert idle["rss_after_paced"]["median_mb"] > 0 and isinstance(idle["per_item_kb_after_paced"], float)
    assert data["idle_memory"]["broker"]["calls_per_item_after_paced"] == paced["broker"]["ok"] / n_agents
    assert [(t["unit"], t["limit"]) for t in data["targets"]] == [
        ("ms", settings.P99_TARGET_MS), ("ms", settings.P99_TARGET_MS),
        ("KB", settings.SESSION_TARGET_KB), ("KB", settings.SESSION_TARGET_KB),
        ("KB", settings.MAILBOX_TARGET_KB), ("KB", settings.MAILBOX_TARGET_KB),
    ]  # fmt: skip
    assert all(t["met"] in (True, False) and t["measured"] is not None for t in data["targets"])

    printed = capsys.readouterr().out
    assert (
        "| service / phase | N | ok | errors |" in printed
        and "| env_server create | 20 | 20 | 0 |" in printed
    )
    assert "load average after" in printed and "checks failed: none" in printed
    assert "| p99 < 10 ms |" in printed and "| env_server Step (one session) | 20 |" in printed
    assert "| comm_broker idle mailbox (joined, empty) | 20 |" in printed


def test_limits_are_raised_only_when_below_what_the_run_needs():
    limits = {(x.service, x.name): x for x in servers.plan_limits(5000, 10, 1, 3, at_limit=False)}
    raised = limits[("env_server", "max_sessions")]
    assert raised.value == 5000 and raised.flag == ["--max-sessions", "5000"]
    assert limits[("env_server", "max_batch_steps")].value == 5000
    assert limits[("comm_broker", "max_agents_per_session")].value is None
    assert limits[("comm_broker", "max_agents_per_session")].flag == []


def test_ring_splits_agents_into_sessions_each_a_ring():
    plan = broker_burst.ring(5, 2)
    assert [(a, s) for a, s, _, _ in plan] == [
        ("agent-0", "scale-0"), ("agent-1", "scale-0"), ("agent-2", "scale-0"),
        ("agent-3", "scale-1"), ("agent-4", "scale-1"),
    ]  # fmt: skip
    sends = {a: to for a, _, to, _ in plan}
    hears = {a: frm for a, _, _, frm in plan}
    assert sends == {"agent-0": "agent-1", "agent-1": "agent-2", "agent-2": "agent-0",
                     "agent-3": "agent-4", "agent-4": "agent-3"}  # fmt: skip
    assert all(hears[to] == a for a, to in sends.items())


def test_leak_check_flags_growth_from_round_to_round():
    def rnd(step: float, close: float) -> dict:
        return {"rss_mb": {"after_create": step - 10, "after_step": step, "after_close": close}}

    steady = env_burst.leak_check(100.0, [rnd(200, 150), rnd(205, 170), rnd(204, 180)])
    assert steady["leak_suspected"] is False and steady["returned_near_baseline"] is False
    assert steady["rounds_compared"] == [2, 3] and steady["growth_mb"] == 100
    leaking = env_burst.leak_check(100.0, [rnd(200, 110), rnd(300, 210), rnd(400, 310)])
    assert leaking["leak_suspected"] is True and leaking["returned_near_baseline"] is True
    assert env_burst.leak_check(100.0, [rnd(200, 110)])["leak_suspected"] is None
    # Small runs: growth below the floor is noise, not a leak.
    small = env_burst.leak_check(70.0, [rnd(75, 75), rnd(76, 76), rnd(77, 77)])
    assert small["leak_suspected"] is False


def test_paced_slices_and_pairs_keep_each_mailbox_to_one_call_slot():
    assert paced.split(list(range(7)), 3) == [[0, 1], [2, 3], [4, 5, 6]]
    plan = broker_burst.ring(5, 2)  # agent-0..2 in scale-0, agent-3..4 in scale-1
    slices = paced.split(plan, 2)
    got = [paced.pairs(s) for s in slices]
    assert got == [
        [("agent-0", "scale-0", "agent-1"), ("agent-1", "scale-0", "agent-0")],
        [
            ("agent-2", "scale-0", "agent-2"),
            ("agent-3", "scale-1", "agent-4"),
            ("agent-4", "scale-1", "agent-3"),
        ],
    ]
    for prs in got:  # every receiver is read by one slot only, and is in the same session as its sender
        assert sorted(r for _, _, r in prs) == sorted(a for a, _, _ in prs)


def test_open_loop_starts_calls_on_schedule_while_earlier_ones_are_still_running():
    async def run() -> tuple[paced_worker.Calls, list[float], float]:
        rec, starts = paced_worker.Calls(), []
        t0 = time.perf_counter() + 0.02

        async def slow(i: int, sched: float) -> None:
            starts.append(time.perf_counter() - sched)
            await asyncio.sleep(0.2)  # 10 times the interval: a closed loop would start 2 calls, not 10

        await paced_worker.open_loop(rec, t0, 0.0, 0.02, 0.2, slow)
        return rec, starts, time.perf_counter() - t0

    rec, starts, wall = asyncio.run(run())
    assert rec.scheduled == len(starts) == 10
    # a closed loop starts call i at i x 0.2 s, not i x 0.02 s: the last 1.6 s late, the whole 2 s
    assert max(starts) < 1.0 and wall < 1.5, (starts, wall)


def test_merge_paced_adds_up_the_workers_and_times_from_the_schedule():
    def worker(lat: list[float], errors: dict) -> dict:
        rec = paced_worker.Calls()
        rec.scheduled = len(lat) + sum(errors.values())
        for x in lat:
            rec.done(0.0, 0.001, x / 1e3, 0.0)  # started 1 ms late, ended at x ms
        for name, n in errors.items():
            for _ in range(n):
                rec.error(name, "boom")
        return {"env": rec.dump()}

    merged = paced.merge_paced(
        [worker([2.0, 3.0], {}), worker([4.0, 50.0], {"lost": 1})], rate=5.0, seconds=1.0
    )
    env = merged["env"]
    assert (
        env["scheduled"] == 5
        and env["ok"] == 4
        and env["errors"] == 1
        and env["errors_by_type"] == {"lost": 1}
    )
    assert env["max_ms"] == 50.0 and env["p50_ms"] == 3.0  # from the scheduled start (0), lateness included
    assert env["service_p99_ms"] == 49.0 and env["late_over_1ms"] == 0 and env["late_max_ms"] == 1.0
    assert env["offered_per_s"] == 5.0 and env["achieved_per_s"] == 4.0
