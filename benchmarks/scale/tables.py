"""The tables of ``marti bench scale`` (burst phases, paced load, idle memory), printed with the benches' one
table printer (:func:`benchmarks.report.markdown_table`)."""

from __future__ import annotations

import argparse

from benchmarks.report import markdown_table
from benchmarks.scale.idle import per_item_kb
from benchmarks.scale.settings import MAILBOX_TARGET_KB, P99_TARGET_MS, RSS_SAMPLES, SESSION_TARGET_KB


def _errors(p: dict) -> str:
    """The error count, with the count per type in brackets when there are any."""
    by_type = p["errors_by_type"]
    return str(p["errors"]) + (
        " (" + ", ".join(f"{k}: {v}" for k, v in sorted(by_type.items())) + ")" if by_type else ""
    )


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def burst_table(rows: dict[str, tuple[str, dict]]) -> str:
    """The burst table: per phase (name, :meth:`Phase.summary`): N, ok, errors, p50/p99 (ms), rate (per s), server
    RSS after the phase (MB)."""
    header = [
        "service / phase",
        "N",
        "ok",
        "errors",
        "p50 ms",
        "p99 ms",
        "latency per",
        "rate /s",
        "server RSS MB",
    ]
    cells = [
        [name, p["n"], p["ok"], _errors(p), _num(p["p50_ms"], ".2f"), _num(p["p99_ms"], ".2f"), p["latency_per"],
         _num(p["rate_per_s"], ",.0f"), _num(p["rss_mb"], ".1f")]
        for name, p in rows.values()
    ]  # fmt: skip
    return markdown_table(header, cells, "lrrlrrlrr")


def fmt_ms(x: float | None) -> str:
    """``x`` with two decimals, or ``-`` when not measured."""
    return "-" if x is None else f"{x:.2f}"


def fmt_met(ok: bool | None) -> str:
    """``met``, ``**missed**``, or ``-`` when not measured."""
    return "-" if ok is None else ("met" if ok else "**missed**")


def paced_and_memory_report(res: dict, args: argparse.Namespace) -> list[dict]:
    """Prints the paced table and the idle-memory table (each row against its target); returns the targets as
    ``{"target", "measured", "limit", "unit", "met"}`` (``met`` None when not measured). Missing a target is
    reported, not a failed check: it depends on the machine and its load."""
    targets: list[dict] = []
    names = {"env": "env_server", "broker": "comm_broker"}
    calls = {
        "env": "Step (one session)",
        "broker": "send_message (batching_size=1) + receiver's get_messages",
    }
    pc = res["paced"]
    if pc is not None:
        print(
            f"Paced load: {pc['rate_per_s']:g} calls/s per service from {pc['procs']} client processes, "
            f"{pc['seconds']:g} s, open loop, both services at once; latency from each call's scheduled start"
        )
        if pc["worker_failures"]:
            print("paced phase failed: " + "; ".join(pc["worker_failures"]))
        print()
        header = [
            "service / paced call",
            "N",
            "scheduled",
            "ok",
            "errors",
            "offered /s",
            "achieved /s",
            "p50 ms",
            "p99 ms",
            "max ms",
            "p99 from actual start ms",
            "late > 1 ms (p99, max ms)",
            "p99 < 10 ms",
        ]
        cells = []
        for key in ("env", "broker"):
            if key not in pc:
                continue
            x = pc[key]
            met = x["p99_ms"] is not None and x["p99_ms"] < P99_TARGET_MS and not x["errors"]
            cells.append(
                [
                    f"{names[key]} {calls[key]}",
                    args.sessions if key == "env" else args.agents,
                    x["scheduled"],
                    x["ok"],
                    _errors(x),
                    f"{x['offered_per_s']:.1f}",
                    f"{x['achieved_per_s']:.1f}",
                    fmt_ms(x["p50_ms"]),
                    fmt_ms(x["p99_ms"]),
                    fmt_ms(x["max_ms"]),
                    fmt_ms(x["service_p99_ms"]),
                    f"{x['late_over_1ms']} ({fmt_ms(x['late_p99_ms'])}, {fmt_ms(x['late_max_ms'])})",
                    fmt_met(met),
                ]
            )
            targets.append(
                {
                    "target": f"{names[key]} paced p99 (no errors)",
                    "measured": x["p99_ms"],
                    "limit": P99_TARGET_MS,
                    "unit": "ms",
                    "met": met,
                }
            )
        print(markdown_table(header, cells, "lrrrlrrrrrrll"))  # fmt: skip
        cpu = ", ".join(
            f"{names[k]} {v['cpu_s']:.1f} CPU s in {v['phase_wall_s']:.1f} s"
            + (f" ({v['cpu_s'] * 1e3 / pc[k]['ok']:.2f} ms a call)" if pc.get(k, {}).get("ok") else "")
            for k, v in res["server_cpu"].items()
            if v["cpu_s"] is not None and v["phase_wall_s"]
        )
        if cpu:
            client = (
                ""
                if pc.get("client_cpu_s") is None
                else f"; the client processes {pc['client_cpu_s']:.1f} CPU s"
            )
            print(f"server CPU during the paced phase: {cpu}{client}")
        for key in ("env", "broker"):
            if key in pc:
                x = pc[key]
                print(
                    f"{names[key]}: {x['over_target']} calls at or over {P99_TARGET_MS:g} ms, by second of the "
                    f"schedule: {' '.join(map(str, x['over_target_by_second']))}"
                )
        if res.get("cores_by_second"):
            print(
                "cores used, by second from the workers' start (the first 0.5 s is the wait for the common "
                "start; the calls end about --paced-seconds later):"
            )
            for k, v in res["cores_by_second"].items():
                label = {"env": "env_server", "broker": "comm_broker", "clients": "client processes",
                         "machine": "whole machine"}[k]  # fmt: skip
                print(f"  {label}: " + " ".join("-" if x is None else f"{x:.2f}" for x in v))
        if res.get("loadavg_paced_start"):
            print(
                "load average at the paced start: " + " ".join(f"{v:.2f}" for v in res["loadavg_paced_start"])
            )
        print()
    memory_report(res, args, targets)
    return targets


def memory_report(res: dict, args: argparse.Namespace, targets: list[dict]) -> None:
    """Prints the idle-memory table: KB per idle env session and per idle mailbox, and again once the paced calls
    are over, each against its target (appended to ``targets``; the second readings are added to ``res``)."""
    names = {"env": "env_server", "broker": "comm_broker"}
    what = {"env": ("idle env session (created + reset)", SESSION_TARGET_KB),
            "broker": ("idle mailbox (joined, empty)", MAILBOX_TARGET_KB)}  # fmt: skip
    pc = res["paced"]
    first, used = [], []
    for key, idle in res["idle"].items():
        label, limit = what[key]
        kb = idle["per_item_kb"]
        met = None if kb is None else kb < limit
        first.append(
            [
                f"{names[key]} {label}",
                idle["n"],
                fmt_ms(idle["rss_before"]["median_mb"]),
                fmt_ms(idle["rss_idle"]["median_mb"]),
                _num(kb, ".1f"),
                f"< {limit:g} KB",
                fmt_met(met),
            ]
        )
        targets.append({"target": f"{names[key]} RSS per {label}", "measured": kb, "limit": limit,
                        "unit": "KB", "met": met})  # fmt: skip
        after = res["rss_after_paced"].get(key)
        if after is not None and pc is not None and key in pc:
            # Used, now idle again: what the calls left behind (env: the per-session outcomes it remembers).
            calls = pc[key]["ok"] / idle["n"] + (2 if key == "env" else 0)  # env: + the two resets
            count = idle["ok"] - (1 if key == "broker" else 0)
            kb2 = per_item_kb(idle["rss_before"], after, count)
            idle["rss_after_paced"] = after
            idle["per_item_kb_after_paced"] = kb2
            idle["calls_per_item_after_paced"] = calls
            met2 = None if kb2 is None else kb2 < limit
            what2 = "session" if key == "env" else "mailbox"
            each = "calls" if key == "env" else "messages sent and received"
            used.append(
                [
                    f"{names[key]} {what2} idle again after the paced phase ({calls:.1f} {each} each)",
                    idle["n"],
                    fmt_ms(idle["rss_before"]["median_mb"]),
                    fmt_ms(after["median_mb"]),
                    _num(kb2, ".1f"),
                    f"< {limit:g} KB",
                    fmt_met(met2),
                ]
            )
            targets.append({"target": f"{names[key]} RSS per {what2} idle after the paced phase",
                            "measured": kb2, "limit": limit, "unit": "KB", "met": met2})  # fmt: skip
    if res["idle"]:
        header = [
            "server / memory per",
            "N",
            "RSS idle before MB",
            "RSS with N idle MB",
            "KB each",
            "target",
            "met",
        ]
        print(markdown_table(header, first + used, "lrrrrll"))
        print(
            f"(RSS: median of {RSS_SAMPLES} reads of VmRSS after {args.settle:g} s of quiet; "
            "the mailbox figure divides by N - 1: the first agent is the warm-up)"
        )


def fmt_mb(x: float | None) -> str:
    """``x`` MB with one decimal, or ``-`` when not measured."""
    return "-" if x is None else f"{x:.1f} MB"
