"""The comm_broker burst of ``marti bench scale``: N agents in a ring, each sending ``--messages`` messages to
the next and long-polling for its own; every message checked delivered once, in order, from the right sender."""

from __future__ import annotations

import asyncio
import collections
import math
import time

from benchmarks.broker import make_messages
from benchmarks.scale.phase import Phase, gather_phase, limit_probe
from benchmarks.scale.servers import Server


def ring(agents: int, sessions: int) -> list[tuple[str, str, str, str]]:
    """``(agent, session, sends_to, receives_from)`` for every agent: agents split into ``sessions``
    contiguous groups, each group a ring (an agent alone in its session sends to itself)."""
    per = math.ceil(agents / sessions)
    out = []
    for k in range(sessions):
        members = [f"agent-{i}" for i in range(k * per, min(agents, (k + 1) * per))]
        for j, a in enumerate(members):
            out.append((a, f"scale-{k}", members[(j + 1) % len(members)], members[j - 1]))
    return out


async def bench_broker(
    server: Server, agents: int, sessions: int, messages: int, idle_timeout_s: float, at_limit: bool
) -> dict:
    """N agents (SDK defaults, one shared ``grpc.aio`` channel): join, then ``messages`` rounds of send to the
    next agent and long-poll for the previous one's message; returns the phases and the delivery checks."""
    from marti.aio import MartiCommClient
    from marti.clients.broker import IDEMPOTENT_METHODS
    from marti.rpc.client.channel import make_channel

    texts = [m["text"] for m in make_messages(64)]
    plan = ring(agents, sessions)
    channel = make_channel(server.address, aio=True, idempotent_methods=IDEMPOTENT_METHODS, service="broker")
    clients = {a: MartiCommClient(a, server.address, session=s, channel=channel) for a, s, _, _ in plan}
    join = Phase("comm_broker join", agents)
    exchange = Phase(f"comm_broker send+receive x{messages} (ring)", agents, unit="delivery, end to end")
    close = Phase("comm_broker close", agents)
    rss = {"before": server.rss_mb()}
    cpu0 = server.cpu_s()
    sent = collections.Counter()
    received = collections.Counter()
    problems = collections.Counter()  # wrong sender, duplicate, out of order
    lost_waits = 0
    first_sent_at: list[float] = []
    last_received_at: list[float] = []

    async def joined(a: str) -> None:
        await clients[a].connect()
        await clients[a].get_messages(timeout_s=0)

    await gather_phase(join, server, [join.timed(joined(a)) for a, _, _, _ in plan])
    rss["after_join"] = join.rss_mb
    at_cap = None
    if at_limit:
        extra = MartiCommClient("agent-extra", server.address, session=plan[0][1], channel=channel)
        at_cap = await limit_probe(lambda: joined_extra(extra))
        try:
            await extra.close()
        except Exception as exc:  # reported with the probe, not counted against the messages
            at_cap["close_error"] = f"{type(exc).__name__}: {exc}"

    async def agent(a: str, to: str, frm: str, index: int) -> bool:
        """One agent's rounds; returns whether it received every message it was due."""
        nonlocal lost_waits
        c = clients[a]
        expected_seq = 0
        for r in range(messages):
            payload = {"from": a, "seq": r, "text": texts[(index + r) % len(texts)]}
            t = time.time()
            try:
                await c.send_message(to, payload)
            except Exception as exc:
                exchange.error(exc)
                return False
            sent[a] += 1
            if r == 0:
                first_sent_at.append(t)
            idle_since = time.monotonic()
            while expected_seq <= r:
                try:
                    got = await c.get_messages(max_messages=256, timeout_s=1.0)
                except Exception as exc:
                    exchange.error(exc)
                    return False
                now = time.time()
                for m in got:
                    content = m.content
                    if m.sender != frm or content.get("from") != frm:
                        problems["wrong sender"] += 1
                    elif content["seq"] < expected_seq:
                        problems["duplicate"] += 1
                    elif content["seq"] > expected_seq:
                        problems["out of order or gap"] += 1
                        expected_seq = content["seq"] + 1
                    else:
                        expected_seq += 1
                    received[a] += 1
                    exchange.lat.append(now - m.sent_at)
                    exchange.ok += 1
                if got:
                    idle_since = time.monotonic()
                    last_received_at.append(now)
                elif time.monotonic() - idle_since > idle_timeout_s:
                    lost_waits += 1
                    return False
        return True

    t0 = time.perf_counter()
    done = await asyncio.gather(*(agent(a, to, frm, i) for i, (a, _, to, frm) in enumerate(plan)))
    exchange.wall = time.perf_counter() - t0
    exchange.rss_mb = server.rss_mb()
    exchange.count = sum(received.values())
    rss["after_exchange"] = exchange.rss_mb
    await gather_phase(close, server, [close.timed(clients[a].close()) for a, _, _, _ in plan])
    # The broker's counters once every client has closed (so its last acks are in): through a client that is
    # never connected (GetStats joins nothing).
    try:
        stats = await MartiCommClient(plan[0][0], server.address, channel=channel).get_broker_stats(True)
        broker_stats = {
            k: getattr(stats, k)
            for k in ("sent", "enqueued", "delivered", "redelivered", "acked", "duplicates", "rejected",
                      "dead_lettered", "expired", "sessions", "agents", "pending", "in_flight")
        }  # fmt: skip
    except Exception as exc:
        broker_stats = {"error": f"{type(exc).__name__}: {exc}"}
    await channel.close()
    rss["after_close"] = close.rss_mb
    rss["peak_hwm"] = server.hwm_mb()
    cpu1 = server.cpu_s()
    total_sent, total_received = sum(sent.values()), sum(received.values())
    span = (max(last_received_at) - min(first_sent_at)) if first_sent_at and last_received_at else 0.0
    return {
        "phases": {"join": join, "exchange": exchange, "close": close},
        "agents_ok": sum(1 for ok in done if ok),
        "sent": total_sent,
        "delivered": total_received,
        "lost": total_sent - total_received,
        "problems": dict(problems),
        "agents_given_up": lost_waits,
        "first_send_to_last_delivery_s": span,
        "msgs_per_s": total_received / span if span > 0 else None,
        "broker_stats": broker_stats,
        "rss_mb": rss,
        "server_cpu_s": (cpu1 - cpu0) if cpu0 is not None and cpu1 is not None else None,
        "at_limit": at_cap,
    }


async def joined_extra(client) -> None:
    """Joins one agent beyond the session's cap (``--at-limit``)."""
    await client.connect()
    await client.get_messages(timeout_s=0)
