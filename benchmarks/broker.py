"""``marti bench broker``: the comm_broker against a Ray-actor communicator and a bare gRPC stream.

All in one run on one machine, with 1 KB realistic agent messages (JSON: about 500 characters of
natural-language text, agent ids, step, reward):

(a) baseline: a Ray actor holding a dict of message lists (send appends, get pops), 8 concurrent callers;
(b) the broker (separate process) through the SDK, 8 concurrent senders, unbatched (sync SDK) and batched
    (sync SDK in 8 threads, and asyncio SDK in 8 tasks);
(c) bare ``grpc.aio`` streams carrying the same compressed batch frames through a relay process (senders
    stream frames in, acked per frame; one receiver streams them out): the transport ceiling for the same
    job, with no protobuf, compression or routing work.

The broker, the relay and the receiving agent (draining concurrently with long polls) each run in their
own process, as real agents do; the SDK senders run in the bench process. Throughput clocks stop when
the receiver holds every message.

Also a paced run: one sender at 100 msgs/s, unbatched (``batching_size=1``), latency per call (target p99
< 5 ms).

(d) the SDK as a new user meets it, every setting at its default (batches of 128, a 1 ms linger, and
    ``send_when_idle``: a message buffered while no batch is in flight goes out at once):
    ``defaults``: one ``MartiCommClient`` sends ``--defaults-messages`` (3,000) messages with ``send_message``,
    then ``flush``; another (its own process) drains with ``get_messages(timeout_s=1)``; compared with the Ray
    actor of (a) fed the same messages by one caller (``ray x1``, target >= 10x; its clock covers the sends
    only, its drain is one call after), and with the 8-caller Ray run (a);
    ``lone``: one default client sends one message every 10 ms (100 msgs/s, so each is alone in its batch,
    with no batch in flight: the flush timer sends it at once, without the linger); latency is end-to-end,
    from ``send_message`` to the receiving process holding it (from the message's ``sent_at``; target p99
    < 5 ms); then the same with ``batching_size=1`` (no timer: ``send_message`` itself sends it; what the
    hand-off to the timer adds).

Prints msgs/s, p50/p99 latency, bytes on the wire, compression ratio, the ratios b/a, b/c and defaults/ray x1,
and the load average before and after; ``--json PATH`` also writes every number. ``--arms`` runs a subset.
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import random
import statistics
import threading
import time

from benchmarks.report import (
    bench_parser,
    check_json_path,
    markdown_table,
    positive_float,
    positive_int,
    write_json,
)
from benchmarks.server import Server

WORDS = (
    "the plan budget task agent resource allocate units research logistics reward round propose confirm "
    "counter offer reasoning expected value because should we I you think move two three from to this next "
    "risk team share score evaluate step action observation policy improve negotiate agree disagree option "
    "cost benefit priority deadline schedule assign review result final answer check verify summary goal"
).split()


def make_messages(n: int, seed: int = 0) -> list[dict]:
    """n realistic agent messages of about 1 KB of JSON each (random natural-language-like text)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        text = ""
        while len(text) < 650:
            sentence = " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 14)))
            text += sentence.capitalize() + ". "
        out.append(
            {
                "sender": f"agent_{i % 8}",
                "receiver": "agent_receiver",
                "episode": f"episode-{i // 100}",
                "step": i,
                "turn": i % 10,
                "reward": round(rng.uniform(-1, 1), 4),
                "role": rng.choice(["planner", "executor", "evaluator"]),
                "text": text.strip(),
                "metadata": {
                    "model": "SmolLM2-135M-Instruct",
                    "tokens": rng.randint(80, 160),
                    "temperature": 0.7,
                },
                "tool_calls": [
                    {"name": "allocate", "arguments": {"task": rng.randint(1, 9), "units": rng.randint(1, 5)}}
                ],
            }
        )
    return out


def pct(values: list[float], q: float) -> float:
    """q-th percentile (0..100) by nearest rank, in the values' unit."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * len(s)) - 1))] if s else float("nan")


def _timed(fn) -> float:
    """Runs fn() in this thread; returns wall seconds."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run_threads(n_threads: int, fn) -> float:
    """Runs fn(k) in n_threads threads; returns wall seconds."""
    threads = [threading.Thread(target=fn, args=(k,)) for k in range(n_threads)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


# ---------------------------------------------------------------------------------------------- (a) Ray
def bench_ray(messages: list[dict], callers: int) -> dict | None:
    """The baseline: a Ray actor communicator (dict of lists), driven by ``callers`` threads."""
    try:
        import ray
    except ImportError:
        return None
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")

    @ray.remote
    class Communicator:
        def __init__(self):
            self.boxes: dict[str, list] = {}

        def send_message(self, receiver, message):
            self.boxes.setdefault(receiver, []).append(message)
            return True

        def get_messages(self, agent):
            return self.boxes.pop(agent, [])

    actor = Communicator.remote()
    ray.get(actor.send_message.remote("warm", {}))
    per = len(messages) // callers
    lat: list[float] = []

    def caller(k: int) -> None:
        local = []
        for m in messages[k * per : (k + 1) * per]:
            t = time.perf_counter()
            ray.get(actor.send_message.remote(m["receiver"], m))
            local.append(time.perf_counter() - t)
        lat.extend(local)

    wall = run_threads(callers, caller) if callers > 1 else _timed(lambda: caller(0))
    got = ray.get(actor.get_messages.remote("agent_receiver"))
    ray.shutdown()
    assert len(got) == per * callers
    raw = sum(len(json.dumps(m)) for m in messages[: per * callers])
    return {"n": per * callers, "wall": wall, "lat": lat, "wire": None, "raw": raw}


# ---------------------------------------------------------------------------------------------- (b) broker
#: The broker's flags: room for every message of a run (in memory), and no per-call logging.
BROKER_FLAGS = ["--max-mailbox-messages", "10000000", "--max-mailbox-bytes", str(8 << 30), "--log-level",
                "WARNING"]  # fmt: skip


def _receiver_process(address: str, session: str, expected: int, q) -> None:
    """The receiving agent, in its own process (as a real agent is): drains with long polls of up to 4096
    messages until it holds ``expected`` (or nothing came for 30 s), then reports
    ``(time.monotonic(), received)``."""
    import asyncio

    from marti.clients.broker import AsyncMartiCommClient

    async def run() -> None:
        receiver = await AsyncMartiCommClient("agent_receiver", address, session=session).connect()
        await receiver.get_messages()
        q.put("ready")
        received, idle_since = 0, time.monotonic()
        while received < expected and time.monotonic() - idle_since < 30:
            got = await receiver.get_messages(max_messages=4096, timeout_s=1)
            if got:
                received += len(got)
                idle_since = time.monotonic()
        q.put((time.monotonic(), received))
        await receiver.close()

    asyncio.run(run())


class _Receiver:
    """Starts :attr:`target` (:func:`_receiver_process`) in its own process and waits until it is connected;
    :meth:`wait` returns when it held every message, and keeps its whole report in :attr:`report`."""

    #: The receiving process: ``target(address, session, expected, queue)``; it puts ``"ready"``, then its report
    #: ``(time.monotonic() at the end, messages received, *more)``.
    target = staticmethod(_receiver_process)

    def __init__(self, address: str, session: str, expected: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.q = ctx.Queue()
        self.proc = ctx.Process(target=self.target, args=(address, session, expected, self.q))
        self.proc.start()
        if self.q.get(timeout=60) != "ready":
            raise RuntimeError("receiver did not start")
        self.expected = expected
        self.report: tuple = ()

    def wait(self) -> float:
        """Waits for the receiver; returns the time.monotonic() at which it held every message."""
        self.report = self.q.get(timeout=300)
        self.proc.join(10)
        done_at, received = self.report[:2]
        assert received == self.expected, (received, self.expected)
        return done_at


def bench_broker(address: str, messages: list[dict], senders: int, batch: int, session: str) -> dict:
    """``senders`` sync-SDK senders (threads) to one receiver that drains concurrently in its own process.

    The clock runs from the first send until the receiver holds every message, so delivery is included.
    Latency is per Send rpc (one message, or one batch including building its frame).
    """
    from marti.clients.broker import MartiCommClient

    per = len(messages) // senders
    expected = per * senders
    receiver = _Receiver(address, session, expected)
    clients = [
        MartiCommClient(f"agent_{k}", address, session=session, batching_size=batch, update_frequency_s=0)
        for k in range(senders)
    ]
    lat: list[float] = []

    def sender(k: int) -> None:
        local = []
        c = clients[k]
        mine = messages[k * per : (k + 1) * per]
        for i in range(0, len(mine), batch):
            t = time.perf_counter()
            for m in mine[i : i + batch]:
                c.send_message("agent_receiver", m)
            c.flush(acks=False)
            local.append(time.perf_counter() - t)
        lat.extend(local)

    t0 = time.monotonic()
    run_threads(senders, sender)
    wall = receiver.wait() - t0
    stats = [c.get_communication_stats() for c in clients]
    for c in clients:
        c.close()
    raw = sum(s.bytes_sent_raw for s in stats)
    wire = sum(s.bytes_sent_wire for s in stats)
    return {"n": expected, "wall": wall, "lat": lat, "wire": wire, "raw": raw, "batch": batch}


def bench_broker_aio(address: str, messages: list[dict], senders: int, batch: int, session: str) -> dict:
    """As :func:`bench_broker`, with the asyncio SDK (``marti.aio.MartiCommClient``): ``senders`` sender
    tasks on one event loop (no threads contending for the GIL); the receiver is again its own process."""
    import asyncio

    from marti.clients.broker import AsyncMartiCommClient

    per = len(messages) // senders
    expected = per * senders
    lat: list[float] = []
    receiver = _Receiver(address, session, expected)

    async def run() -> tuple[float, list]:
        clients = [
            await AsyncMartiCommClient(
                f"agent_{k}", address, session=session, batching_size=batch, update_frequency_s=0
            ).connect()
            for k in range(senders)
        ]

        async def sender(k: int) -> None:
            c = clients[k]
            mine = messages[k * per : (k + 1) * per]
            for i in range(0, len(mine), batch):
                t = time.perf_counter()
                for m in mine[i : i + batch]:
                    await c.send_message("agent_receiver", m)
                await c.flush(acks=False)
                lat.append(time.perf_counter() - t)

        t0 = time.monotonic()
        await asyncio.gather(*(sender(k) for k in range(senders)))
        stats = [c.get_communication_stats() for c in clients]
        for c in clients:
            await c.close()
        return t0, stats

    t0, stats = asyncio.run(run())
    wall = receiver.wait() - t0
    raw = sum(s.bytes_sent_raw for s in stats)
    wire = sum(s.bytes_sent_wire for s in stats)
    return {"n": expected, "wall": wall, "lat": lat, "wire": wire, "raw": raw, "batch": batch}


def _send_paced(client, messages: list[dict], n: int, rate: float) -> tuple[float, list[float]]:
    """Sends ``n`` messages (cycling through ``messages``) to ``agent_receiver`` on a fixed schedule of ``rate``
    per second (a late call is not made up for by sending faster). Returns (seconds from the first scheduled send
    to the end of the last, the seconds each ``send_message`` call took)."""
    lat: list[float] = []
    start = time.perf_counter()
    for i in range(n):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        t = time.perf_counter()
        client.send_message("agent_receiver", messages[i % len(messages)])
        lat.append(time.perf_counter() - t)
    return time.perf_counter() - start, lat


def bench_paced(address: str, messages: list[dict], rate: float, seconds: float) -> dict:
    """One unbatched sender (``batching_size=1``: one Send per message) at ``rate`` msgs/s; latency per
    send_message."""
    from marti.clients.broker import MartiCommClient

    n = int(rate * seconds)
    with (
        MartiCommClient("paced", address, session="bench-paced", batching_size=1) as c,
        MartiCommClient("agent_receiver", address, session="bench-paced") as r,
    ):
        r.get_messages()
        for m in messages[:20]:  # warm up the channel
            c.send_message("agent_receiver", m)
        wall, lat = _send_paced(c, messages, n, rate)
    return {"n": n, "wall": wall, "lat": lat, "wire": None, "raw": None}


# ---------------------------------------------------------------------------------------------- (d) defaults
def _plain_receiver_process(address: str, session: str, expected: int, q) -> None:
    """A receiving agent written as a new user would: a sync ``MartiCommClient`` with default settings that
    calls ``get_messages(timeout_s=1)`` until it holds ``expected`` messages (or nothing came for 30 s).
    Reports ``(time.monotonic(), received, delays)``: ``delays`` are ``time.time() - message.sent_at`` per
    message, in arrival order (end-to-end: from ``send_message`` to this process holding it)."""
    from marti.clients.broker import MartiCommClient

    with MartiCommClient("agent_receiver", address, session=session) as receiver:
        receiver.get_messages()
        q.put("ready")
        delays: list[float] = []
        idle_since = time.monotonic()
        while len(delays) < expected and time.monotonic() - idle_since < 30:
            got = receiver.get_messages(timeout_s=1)
            now = time.time()
            if got:
                delays += [now - m.sent_at for m in got]
                idle_since = time.monotonic()
        q.put((time.monotonic(), len(delays), delays))


class _PlainReceiver(_Receiver):
    """:func:`_plain_receiver_process` in its own process; after :meth:`wait`, :attr:`delays` are its delays."""

    target = staticmethod(_plain_receiver_process)

    @property
    def delays(self) -> list[float]:
        """Seconds from ``send_message`` to the receiver holding each message, in arrival order (after
        :meth:`wait`; empty before)."""
        return self.report[2] if self.report else []


def bench_defaults(address: str, messages: list[dict], session: str) -> dict:
    """One default ``MartiCommClient`` sends every message with ``send_message``, then ``flush``; a default
    client in another process drains them. The clock runs from the first send until the receiver holds every
    message. Latency is per ``send_message`` call (a buffered message, or the one that filled a batch and sent
    it)."""
    from marti.clients.broker import MartiCommClient

    receiver = _PlainReceiver(address, session, len(messages))
    lat: list[float] = []
    with MartiCommClient("agent_0", address, session=session) as c:
        t0 = time.monotonic()
        for m in messages:
            t = time.perf_counter()
            c.send_message("agent_receiver", m)
            lat.append(time.perf_counter() - t)
        c.flush()
        wall = receiver.wait() - t0
        stats = c.get_communication_stats()
        batch, linger, idle = c._core.batching_size, c._core.update_frequency_s, c._core.send_when_idle
    return {
        "n": len(messages), "wall": wall, "lat": lat, "wire": stats.bytes_sent_wire, "raw": stats.bytes_sent_raw,
        "batching_size": batch, "linger_s": linger, "send_when_idle": idle,
    }  # fmt: skip


def bench_lone(
    address: str, messages: list[dict], rate: float, seconds: float, warm: int = 20, **settings
) -> dict:
    """One default ``MartiCommClient`` (or one with ``settings``) sends a message every ``1 / rate`` s: each is
    alone in its batch and, no batch being in flight, the flush timer sends it at once (``send_when_idle``;
    with ``send_when_idle=False`` in ``settings``, after the linger). Latency is end-to-end delivery (see
    :func:`_plain_receiver_process`); the ``warm`` messages sent first (to warm the channels) are left out.
    ``call_lat`` is per ``send_message``."""
    from marti.clients.broker import MartiCommClient

    n = int(rate * seconds)
    session = f"bench-lone-{len(settings)}"
    receiver = _PlainReceiver(address, session, warm + n)
    with MartiCommClient("lone", address, session=session, **settings) as c:
        for m in messages[:warm]:
            c.send_message("agent_receiver", m)
            time.sleep(1 / rate)
        wall, call_lat = _send_paced(c, messages, n, rate)
        receiver.wait()
    return {
        "n": n,
        "wall": wall,
        "lat": receiver.delays[warm:],
        "call_lat": call_lat,
        "wire": None,
        "raw": None,
    }


# ---------------------------------------------------------------------------------------------- (c) bare
def _bare_server(port_q) -> None:
    """A relay of opaque frames: ``Publish`` streams frames in (1-byte ack each), ``Drain`` streams them out."""
    import asyncio

    import grpc

    async def main():
        queue: asyncio.Queue = asyncio.Queue()

        async def publish(request_iterator, context):
            async for frame in request_iterator:
                queue.put_nowait(frame)
                yield b"\x01"

        async def drain(request, context):
            yield b""  # "subscribed" marker: the receiver starts the clock only after it
            while True:
                yield await queue.get()

        server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20)])
        handlers = {  # raw bytes in and out: no protobuf work
            "Publish": grpc.stream_stream_rpc_method_handler(publish),
            "Drain": grpc.unary_stream_rpc_method_handler(drain),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bare.Bare", handlers),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        port_q.put(port)
        await server.wait_for_termination()

    asyncio.run(main())


def _bare_receiver_process(port: int, n_frames: int, q) -> None:
    """The relay's receiver in its own process (like the broker's): reports time.monotonic() at the last frame."""
    import asyncio

    import grpc

    async def run() -> None:
        async with grpc.aio.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.max_receive_message_length", 64 << 20)]
        ) as ch:
            call = ch.unary_stream("/bare.Bare/Drain")(b"")
            await call.read()  # the relay's "subscribed" marker
            q.put("ready")
            for _ in range(n_frames):
                await call.read()
            q.put(time.monotonic())
            call.cancel()

    asyncio.run(run())


def bench_bare(frames: list[bytes], per_frame: int, streams: int) -> dict:
    """The transport ceiling for the same job: ``streams`` bidi streams send the frames (waiting for a
    1-byte ack per frame) to a relay, and one receiver stream (its own process, as with the broker)
    drains them; the clock stops when the receiver holds every frame. No protobuf, compression or
    routing work anywhere."""
    import asyncio

    import grpc

    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=_bare_server, args=(q,), daemon=True)
    proc.start()
    port = q.get(timeout=30)
    lat: list[float] = []

    rq = ctx.Queue()
    receiver = ctx.Process(target=_bare_receiver_process, args=(port, len(frames), rq), daemon=True)
    receiver.start()
    if rq.get(timeout=60) != "ready":
        raise RuntimeError("relay receiver did not start")

    async def run() -> float:
        async with grpc.aio.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 64 << 20)]
        ) as ch:
            publish = ch.stream_stream("/bare.Bare/Publish")

            async def one(k: int) -> None:
                call = publish()
                for f in frames[k::streams]:
                    t = time.perf_counter()
                    await call.write(f)
                    await call.read()
                    lat.append(time.perf_counter() - t)
                await call.done_writing()

            t0 = time.monotonic()
            await asyncio.gather(*(one(k) for k in range(streams)))
            return t0

    t0 = asyncio.run(run())
    wall = rq.get(timeout=300) - t0
    receiver.join(10)
    proc.terminate()
    n = len(frames) * per_frame
    return {"n": n, "wall": wall, "lat": lat, "wire": sum(len(f) for f in frames), "raw": None}


def batch_frames(messages: list[dict], batch: int) -> tuple[list[bytes], float]:
    """The frames the SDK would send for these messages in batches of ``batch`` (and their ratio)."""
    from marti.clients.broker import _Core

    core = _Core("agent_0", "bench", batch, 1 << 30, 0, 3, True, 1 << 30, 0)
    frames, raw, wire = [], 0, 0
    for i in range(0, len(messages), batch):
        items = [(core.envelope(m, ["agent_receiver"], "", None, 0), 0.0) for m in messages[i : i + batch]]
        f = core.frame(items)
        raw += f.uncompressed_bytes
        wire += len(f.data)
        frames.append(f.SerializeToString())
    return frames, raw / wire


# ---------------------------------------------------------------------------------------------- report
#: Every arm, in the order they run and print: (key, table name, what a latency is).
ARMS = (
    ("a", "(a) Ray actor dict-of-lists, {senders} callers", "message"),
    ("a1", "(a) Ray actor dict-of-lists, 1 caller (ray x1)", "message"),
    ("b1", "(b) broker SDK unbatched, {senders} senders", "message"),
    ("b_sync", "(b) broker sync SDK batched x{batch}, {senders} threads", "batch of {batch}"),
    ("b", "(b) broker aio SDK batched x{batch}, {senders} tasks", "batch of {batch}"),
    ("paced", "(b) broker SDK unbatched, paced 100 msgs/s", "message"),
    ("defaults", "(d) defaults: 1 client send_message + flush, 1 get_messages", "send_message call"),
    ("lone", "(d) defaults: lone messages, paced 100 msgs/s", "delivery, end to end"),
    ("lone1", "(d) batching_size=1: lone messages, paced 100 msgs/s", "delivery, end to end"),
    ("c", "(c) bare grpc.aio relay, same frames, {senders} streams -> 1", "batch of {batch}"),
)
#: ``--arms`` names -> result keys.
ARM_NAMES = {
    "ray": ("a",), "ray1": ("a1",), "unbatched": ("b1",), "batched": ("b_sync", "b"), "paced": ("paced",),
    "defaults": ("defaults",), "lone": ("lone", "lone1"), "bare": ("c",),
}  # fmt: skip


def summary(r: dict) -> dict:
    """The numbers of one arm (what ``--json`` writes for it)."""
    out = {
        "messages": r["n"], "wall_s": r["wall"], "msgs_per_s": r["n"] / r["wall"],
        "p50_ms": pct(r["lat"], 50) * 1e3, "p99_ms": pct(r["lat"], 99) * 1e3,
        "wire_bytes": r.get("wire"), "raw_bytes": r.get("raw"),
        "compression": r["raw"] / r["wire"] if r.get("wire") and r.get("raw") else None,
    }  # fmt: skip
    if r.get("call_lat"):
        out["call_p50_ms"] = pct(r["call_lat"], 50) * 1e3
        out["call_p99_ms"] = pct(r["call_lat"], 99) * 1e3
    for k in ("batching_size", "linger_s", "send_when_idle"):
        if k in r:
            out[k] = r[k]
    return out


def row(name: str, r: dict, unit_lat: str = "call") -> list[str]:
    """One table row's cells: msgs/s, p50/p99 latency (ms) per call, wire MB, compression ratio."""
    rate = r["n"] / r["wall"]
    ratio = f"{r['raw'] / r['wire']:.2f}" if r.get("wire") and r.get("raw") else "-"
    wire = f"{r['wire'] / 1e6:.2f}" if r.get("wire") else "-"
    p50, p99 = f"{pct(r['lat'], 50) * 1e3:.2f}", f"{pct(r['lat'], 99) * 1e3:.2f}"
    return [name, str(r["n"]), f"{rate:,.0f}", p50, p99, unit_lat, wire, ratio]


def targets(results: dict) -> tuple[list[str], dict, list[str]]:
    """The target lines to print, the numbers behind them, and the names of the targets missed (only those
    whose arms ran)."""
    rate = {k: v["n"] / v["wall"] for k, v in results.items() if v}
    lines, numbers, missed = [], {}, []
    best = max((k for k in ("b", "b_sync") if k in rate), key=lambda k: rate[k], default=None)
    best_name = {"b": "aio SDK, 8 tasks", "b_sync": "sync SDK, 8 threads"}.get(best)
    if best and "a" in rate:
        ba = numbers["b/a"] = rate[best] / rate["a"]
        lines.append(
            f"b/a (batched broker, best of the two SDK runs: {best_name} / Ray actor): {ba:.1f}x   (target >= 20x)"
        )
        lines.append(
            f"    (sync SDK: {rate['b_sync'] / rate['a']:.1f}x, aio SDK: {rate['b'] / rate['a']:.1f}x)"
        )
        missed += [] if ba >= 20 else ["b/a"]  # NaN misses
    if best and "c" in rate:
        bc = numbers["b/c"] = rate[best] / rate["c"]
        lines.append(
            f"b/c (batched broker, {best_name} / bare relay): {bc:.2f}   (target >= 0.5, i.e. within 2x)"
        )
        missed += [] if bc >= 0.5 else ["b/c"]
    if "paced" in results:
        p99 = numbers["paced_p99_ms"] = pct(results["paced"]["lat"], 99) * 1e3
        lines.append(f"unbatched p99 at 100 msgs/s: {p99:.2f} ms per call   (target < 5 ms)")
        missed += [] if p99 < 5 else ["p99"]
    if "b" in results:
        cr = numbers["compression"] = results["b"]["raw"] / results["b"]["wire"]
        lines.append(f"compression ratio on batches: {cr:.2f}   (target >= 2.5)")
        missed += [] if cr >= 2.5 else ["compression"]
    if "defaults" in rate:
        if "a1" in rate:
            d1 = numbers["defaults/ray1"] = rate["defaults"] / rate["a1"]
            lines.append(
                f"defaults/ray x1 (1 default client / Ray actor fed by 1 caller): {d1:.1f}x   (target >= 10x)"
            )
            missed += [] if d1 >= 10 else ["defaults/ray1"]
        if "a" in rate:
            d8 = numbers["defaults/ray8"] = rate["defaults"] / rate["a"]
            lines.append(f"    (1 default client / Ray actor with 8 callers: {d8:.1f}x)")
    if "lone" in results:
        lp = numbers["lone_p99_ms"] = pct(results["lone"]["lat"], 99) * 1e3
        lines.append(
            f"default client, lone messages at 100 msgs/s: delivery p99 {lp:.2f} ms   (target < 5 ms)"
        )
        missed += [] if lp < 5 else ["lone p99"]
    if "lone1" in results:
        l1 = numbers["lone_unbatched_p99_ms"] = pct(results["lone1"]["lat"], 99) * 1e3
        lines.append(
            f"    (the same with batching_size=1, sent by the call itself: delivery p99 {l1:.2f} ms)"
        )
    return lines, numbers, missed


def main(argv: list[str] | None = None) -> int:
    """Runs the arms and prints the table. Returns 0, or 1 if a target is missed (``--strict``)."""
    p = bench_parser("broker", __doc__)
    p.add_argument("--messages", type=positive_int, default=16_000, help="messages per throughput run")
    p.add_argument("--ray-messages", type=positive_int, default=4_000, help="messages for the Ray baseline")
    p.add_argument("--batch", type=positive_int, default=100, help="messages per batch in the batched run")
    p.add_argument("--senders", type=positive_int, default=8, help="concurrent senders / callers / streams")
    p.add_argument(
        "--paced-seconds", type=positive_float, default=3.0, help="length of the 100 msgs/s runs (>= 1)"
    )
    p.add_argument(
        "--defaults-messages",
        type=positive_int,
        default=3_000,
        help="messages of the defaults run and of ray x1",
    )
    p.add_argument(
        "--arms",
        default=",".join(ARM_NAMES),
        help=f"comma-separated arms to run (default all: {','.join(ARM_NAMES)})",
    )
    p.add_argument("--no-ray", action="store_true", help="skip the Ray baselines")
    p.add_argument("--strict", action="store_true", help="exit 1 if a target is missed")
    p.add_argument("--json", metavar="PATH", help="also write every number to PATH as JSON")
    args = p.parse_args(argv)
    arms = {a.strip() for a in args.arms.split(",") if a.strip()}
    if arms - set(ARM_NAMES):
        p.error(f"unknown arms {sorted(arms - set(ARM_NAMES))}; choose from {','.join(ARM_NAMES)}")
    if not arms:
        p.error(f"--arms {args.arms!r} names no arm; choose from {','.join(ARM_NAMES)}")
    if args.messages < 4 * args.senders:
        p.error(f"--messages {args.messages} must be at least 4 x --senders ({4 * args.senders})")
    if args.ray_messages < args.senders:
        p.error(f"--ray-messages {args.ray_messages} must be at least --senders ({args.senders})")
    if args.paced_seconds < 1:
        p.error(f"--paced-seconds {args.paced_seconds} must be >= 1 (100 messages at 100 msgs/s)")
    check_json_path(p, args.json)
    if args.no_ray:
        arms -= {"ray", "ray1"}

    msgs = make_messages(max(args.messages, args.defaults_messages))
    # The harness's own test data (tens of thousands of dicts) would otherwise be rescanned by every
    # full garbage collection during the timed runs; no real agent process holds such a pile.
    gc.collect()
    gc.freeze()
    size = statistics.mean(len(json.dumps(m)) for m in msgs[:200])
    load_before = os.getloadavg()
    print(f"message size: {size:.0f} bytes of JSON; senders: {args.senders}; batch: {args.batch}")
    print("load average before: " + " ".join(f"{x:.2f}" for x in load_before))
    results = {}
    if "ray" in arms:
        print("(a) Ray actor baseline ...", flush=True)
        results["a"] = bench_ray(msgs[: args.ray_messages], args.senders)
    if "ray1" in arms:
        print("(a) Ray actor baseline, 1 caller ...", flush=True)
        results["a1"] = bench_ray(msgs[: args.defaults_messages], 1)
    if arms & {"unbatched", "batched", "paced", "defaults", "lone"}:
        with Server("broker", BROKER_FLAGS) as broker:
            address = broker.address
            if "unbatched" in arms:
                print("(b) broker unbatched ...", flush=True)
                results["b1"] = bench_broker(
                    address, msgs[: args.messages // 4], args.senders, 1, "bench-unbatched"
                )
            if "batched" in arms:
                print("(b) broker batched ...", flush=True)
                results["b_sync"] = bench_broker(
                    address, msgs[: args.messages], args.senders, args.batch, "bench-batched"
                )
                print("(b) broker batched, asyncio SDK ...", flush=True)
                results["b"] = bench_broker_aio(
                    address, msgs[: args.messages], args.senders, args.batch, "bench-batched-aio"
                )
            if "paced" in arms:
                print("(b) paced 100 msgs/s unbatched ...", flush=True)
                results["paced"] = bench_paced(address, msgs, 100.0, args.paced_seconds)
            if "defaults" in arms:
                print("(d) defaults: 1 client, send_message + flush ...", flush=True)
                results["defaults"] = bench_defaults(
                    address, msgs[: args.defaults_messages], "bench-defaults"
                )
            if "lone" in arms:
                print("(d) defaults: lone messages at 100 msgs/s ...", flush=True)
                results["lone"] = bench_lone(address, msgs, 100.0, args.paced_seconds)
                print("(d) batching_size=1: lone messages at 100 msgs/s ...", flush=True)
                results["lone1"] = bench_lone(address, msgs, 100.0, args.paced_seconds, batching_size=1)
    if "bare" in arms:
        print("(c) bare grpc.aio stream ...", flush=True)
        frames, ratio = batch_frames(msgs[: args.messages], args.batch)
        results["c"] = bench_bare(frames, args.batch, args.senders)
        results["c"]["raw"] = results["c"]["wire"] * ratio
    load_after = os.getloadavg()

    print()
    header = ["run", "msgs", "msgs/s", "p50 ms", "p99 ms", "latency per", "wire MB", "compression"]
    rows = [
        row(name.format(batch=args.batch, senders=args.senders), results[key], unit.format(batch=args.batch))
        for key, name, unit in ARMS
        if results.get(key)
    ]
    print(markdown_table(header, rows, "lrrrrlrr"))
    if results.get("lone"):
        lone = summary(results["lone"])
        print(
            f"\n(d) lone messages: send_message call p50 {lone['call_p50_ms']:.3f} ms, "
            f"p99 {lone['call_p99_ms']:.3f} ms (it only buffers)"
        )
    if results.get("defaults"):
        d = results["defaults"]
        print(
            f"(d) default settings: batching_size={d['batching_size']}, update_frequency_s={d['linger_s']}, "
            f"send_when_idle={d['send_when_idle']}"
        )
    lines, numbers, missed = targets(results)
    print()
    for line in lines:
        print(line)
    print("targets missed: " + (", ".join(missed) if missed else "none"))
    print("load average after: " + " ".join(f"{x:.2f}" for x in load_after))
    if args.json:
        out = {
            "benchmark": "broker",
            "message_bytes": size,
            "args": vars(args),
            "arms": {key: summary(results[key]) for key, _, _ in ARMS if results.get(key)},
            "ratios": numbers,
            "targets_missed": missed,
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in load_after],
        }
        write_json(args.json, out)
        print(f"wrote {args.json}")
    return 1 if missed and args.strict else 0


if __name__ == "__main__":
    raise SystemExit(main())
