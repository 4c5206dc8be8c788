"""The summaries of the burst phases of ``marti bench scale`` (the lines after the burst table) and their
checks."""

from __future__ import annotations

import argparse
import math

from benchmarks.scale.tables import fmt_mb


def env_summary(env_result: dict, args: argparse.Namespace) -> list[str]:
    """Prints what the env_server burst did over its rounds (sessions, steps/s, RSS, the leak check, the cap);
    returns the checks that failed."""
    failed: list[str] = []
    for r, rd in enumerate(env_result["rounds"]):
        if rd["sessions_ok"] != args.sessions:
            failed.append(f"env round {r + 1}: {rd['sessions_ok']}/{args.sessions} sessions succeeded")
        if rd["probe_failed"]:
            failed.append(f"env round {r + 1}: a limit probe did not get the expected answer")
    r0 = env_result["rounds"][0]
    steps = sum(rd["phases"][k].count for rd in env_result["rounds"] for k in ("step", "batch"))
    step_wall = sum(rd["phases"][k].wall for rd in env_result["rounds"] for k in ("step", "batch"))
    print(
        "env_server: sessions succeeded per round: "
        + ", ".join(f"{rd['sessions_ok']}/{args.sessions}" for rd in env_result["rounds"])
        + f"; episodes reset mid-run: {sum(rd['episode_resets'] for rd in env_result['rounds'])}"
        + f"; total steps/s (both step phases, all rounds): {steps / step_wall:,.0f}"
    )
    print(
        f"env_server RSS: before {fmt_mb(env_result['rss_before_mb'])}; "
        + "; ".join(
            f"round {i + 1}: after create {fmt_mb(rd['rss_mb']['after_create'])}, after steps "
            f"{fmt_mb(rd['rss_mb']['after_step'])}, 1 s after close {fmt_mb(rd['rss_mb']['after_close'])}"
            for i, rd in enumerate(env_result["rounds"])
        )
        + f"; peak (VmHWM) {fmt_mb(env_result['rounds'][-1]['rss_mb']['peak_hwm'])}"
    )
    lc = env_result["leak_check"]
    if lc.get("returned_near_baseline") is not None:
        line = (
            f"env_server leak check: grew {lc['growth_mb']:.1f} MB, "
            f"kept {lc['retained_after_close_mb']:.1f} MB after close "
            f"(near baseline: {'yes' if lc['returned_near_baseline'] else 'no'})"
        )
        if lc["leak_suspected"] is not None:
            a, z = lc["rounds_compared"]
            line += (
                f"; with all sessions stepped, RSS grew {lc['growth_per_round_mb']:+.1f} MB per round "
                f"from round {a} to {z} (leak suspected: {'YES' if lc['leak_suspected'] else 'no'})"
            )
        print(line)
        if lc["leak_suspected"]:
            failed.append("env_server: memory leak suspected")
    print(f"env_server CPU: {sum(rd['server_cpu_s'] or 0 for rd in env_result['rounds']):.1f} s")
    if r0["at_limit"]:
        a = r0["at_limit"]
        print(f"env_server at the cap (session {args.sessions + 1} of max_sessions={args.sessions}): "
              f"{a['result']} {a['error'] or ''}: {a['message']}")  # fmt: skip
        print(f"env_server after closing all: a new session accepted: {r0['slot_freed_after_close']}")
    return failed


def broker_summary(b: dict, args: argparse.Namespace) -> list[str]:
    """Prints what the comm_broker burst did (messages, the broker's counters, RSS, the cap); returns the checks
    that failed."""
    failed: list[str] = []
    if b["lost"] or b["problems"] or b["agents_ok"] != args.agents:
        failed.append(
            f"comm_broker: sent {b['sent']}, delivered {b['delivered']}, problems {b['problems']}, "
            f"agents done {b['agents_ok']}/{args.agents}"
        )
    bs = b["broker_stats"]
    if "error" in bs or bs["sent"] != b["sent"] or bs["pending"]:
        failed.append(f"comm_broker: its counters disagree with the agents' (sent {b['sent']}): {bs}")
    rate = f"{b['msgs_per_s']:,.0f}" if b["msgs_per_s"] else "-"
    print(
        f"comm_broker: sent {b['sent']}, delivered {b['delivered']}, lost {b['lost']}, "
        f"duplicates/out of order/wrong sender: {b['problems'] or 'none'}; agents that gave up waiting: "
        f"{b['agents_given_up']}; {rate} msgs/s (first send to last delivery)"
    )
    print("comm_broker server counters: " + ", ".join(f"{k}={v}" for k, v in b["broker_stats"].items()))
    print(
        f"comm_broker RSS: before {fmt_mb(b['rss_mb']['before'])}, "
        f"after join {fmt_mb(b['rss_mb']['after_join'])}, "
        f"after messages {fmt_mb(b['rss_mb']['after_exchange'])}, after the clients closed "
        f"{fmt_mb(b['rss_mb']['after_close'])} (sessions and mailboxes stay until idle expiry); peak "
        f"{fmt_mb(b['rss_mb']['peak_hwm'])}; CPU {b['server_cpu_s'] or 0:.1f} s"
    )
    if b["at_limit"]:
        a = b["at_limit"]
        per = math.ceil(args.agents / args.broker_sessions)
        print(f"comm_broker at the cap (agent {per + 1} of max_agents_per_session={per}): "
              f"{a['result']} {a['error'] or ''}: {a['message']}")  # fmt: skip
        if a["result"] != "refused":
            failed.append("comm_broker: the agent cap did not hold")
    return failed
