"""``marti bench scale`` end to end in ``--quick`` mode against a real env server and broker: the plumbing
(every session succeeds, every message arrives once, the caps answer with the typed error), not the speed."""

from __future__ import annotations

import json

from benchmarks import scale


def test_quick_run_at_the_limits_writes_every_number(tmp_path, capsys):
    out = tmp_path / "scale.json"
    argv = ["--quick", "--at-limit", "--env-rounds", "2", "--json", str(out)]
    assert scale.main(argv) == 0
    data = json.loads(out.read_text())
    n_sessions, n_agents = scale.QUICK["sessions"], scale.QUICK["agents"]
    turns, messages = scale.QUICK["turns"], scale.QUICK["messages"]
    assert data["checks_failed"] == [] and data["servers_alive"] == {"env_server": True, "comm_broker": True}

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

    printed = capsys.readouterr().out
    assert (
        "| service / phase | N | ok | errors |" in printed
        and "| env_server create | 20 | 20 | 0 |" in printed
    )
    assert "load average after" in printed and "checks failed: none" in printed


def test_limits_are_raised_only_when_below_what_the_run_needs():
    limits = {(x.service, x.name): x for x in scale.plan_limits(5000, 10, 1, 3, at_limit=False)}
    raised = limits[("env_server", "max_sessions")]
    assert raised.value == 5000 and raised.flag == ["--max-sessions", "5000"]
    assert limits[("env_server", "max_batch_steps")].value == 5000
    assert limits[("comm_broker", "max_agents_per_session")].value is None
    assert limits[("comm_broker", "max_agents_per_session")].flag == []


def test_ring_splits_agents_into_sessions_each_a_ring():
    plan = scale.ring(5, 2)
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

    steady = scale.leak_check(100.0, [rnd(200, 150), rnd(205, 170), rnd(204, 180)])
    assert steady["leak_suspected"] is False and steady["returned_near_baseline"] is False
    assert steady["rounds_compared"] == [2, 3] and steady["growth_mb"] == 100
    leaking = scale.leak_check(100.0, [rnd(200, 110), rnd(300, 210), rnd(400, 310)])
    assert leaking["leak_suspected"] is True and leaking["returned_near_baseline"] is True
    assert scale.leak_check(100.0, [rnd(200, 110)])["leak_suspected"] is None
    # Small runs: growth below the floor is noise, not a leak.
    small = scale.leak_check(70.0, [rnd(75, 75), rnd(76, 76), rnd(77, 77)])
    assert small["leak_suspected"] is False
