"""``marti bench gateway``'s model-free arms: the gateway's own overhead per request, and 400 requests in flight.

Both serve from :class:`~services.trainer.rollout.engines.instant.InstantRolloutEngine` (no model: it answers at once with
deterministic token ids) through the gateway's ordinary :class:`EngineBackend` (each agent's tokenizer and chat
template) and a :class:`GatewayServer` with the default :class:`GatewayLimits`, so what is timed is the gateway,
its adapters and its clients, not a model.

* **Overhead** (1 client, the calls one after another, as an agent makes them): ``direct`` (the baseline) calls the
  engine's ``generate`` with the prompt's token ids in this process; ``in-process`` calls ``Gateway.generate`` on
  the gateway's loop; ``grpc`` and ``http`` send chat requests from another process (:func:`benchmarks.gateway._remote`:
  the ``marti.aio`` client, the ``openai`` client). Each arm's overhead is its p50 (p99) latency minus the
  direct call's p50 (p99); the issue's target is a p50 overhead <= 3 ms over HTTP.
* **Load** (``--load-clients`` requests in flight over HTTP, default 400): as many concurrent tasks in a client
  process, each sending ``--load-requests`` chat completions one after the other through one ``openai`` client
  with a connection per task, with a 60 s timeout and no retries. Reported: errors (by kind), timeouts, latency p50
  and p99, the gateway's event-loop lag during the arm (its :class:`LoopLagProbe`, as ``/v1/gateway/stats``
  reports it), and the CPU seconds of the gateway's process and of the client process (on a small machine the
  client's share says who limits the latency); the target is 0 errors.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import statistics
import time
from typing import Any

from benchmarks.gateway import AGENTS, PROMPT, _pct, _remote
from benchmarks.report import markdown_table

#: Seconds a load request may take before the client gives up (counted as a timeout).
LOAD_TIMEOUT_S = 60.0


def _latency_summary(lat: list[float]) -> dict[str, Any]:
    """Requests, p50 and p99 (seconds) of ``lat`` (zeros when empty)."""
    if not lat:
        return {"requests": 0, "p50_s": 0.0, "p99_s": 0.0}
    return {"requests": len(lat), "p50_s": statistics.median(lat), "p99_s": _pct(lat, 0.99)}


def _direct(engine: Any, tok: Any, requests: int, max_tokens: int) -> list[float]:
    """``requests`` engine calls of one prompt each (its ids made beforehand); their latencies, seconds."""
    from marti.types.inference import SamplingParams
    from services.trainer.rollout.engines.base import chat_to_ids

    ids = chat_to_ids(tok, PROMPT)
    sampling = SamplingParams(max_new_tokens=max_tokens, temperature=1.0)
    lat = []
    for i in range(requests):
        t0 = time.perf_counter()
        engine.generate(AGENTS[i % 2], [ids], sampling)
        lat.append(time.perf_counter() - t0)
    return lat


def _in_process(server: Any, gateway: Any, requests: int, max_tokens: int) -> list[float]:
    """``requests`` ``Gateway.generate`` calls one after another on the gateway's loop; their latencies."""
    from marti.types.inference import SamplingParams

    sampling = SamplingParams(max_new_tokens=max_tokens, temperature=1.0)

    async def go() -> list[float]:
        await gateway.generate(AGENTS[0], PROMPT, sampling)  # warm-up
        lat = []
        for i in range(requests):
            t0 = time.perf_counter()
            await gateway.generate(AGENTS[i % 2], PROMPT, sampling)
            lat.append(time.perf_counter() - t0)
        return lat

    return server.run(go(), timeout_s=600)


def _cpu_s() -> float:
    """CPU seconds (user + system) of this process, the gateway's, so far: ``time.process_time`` (nanosecond
    clock), not ``os.times``, whose 10 ms ticks read a few requests of about 1 ms each as 0 or 10 ms."""
    return time.process_time()


def _remote_arm(kind: str, target: str, requests: int, max_tokens: int) -> dict[str, Any]:
    """One client process of ``kind``: latencies, and CPU milliseconds per request of the gateway's process
    (its warm-up request included) and of the client."""
    cpu0 = _cpu_s()
    raw = _remote(kind, target, "", 1, requests, max_tokens)
    out = _latency_summary(raw["latencies"])
    out["gateway_cpu_ms_per_request"] = (_cpu_s() - cpu0) / (requests + 1) * 1e3
    out["client_cpu_ms_per_request"] = raw["client_cpu_s"] / requests * 1e3
    return out


def overhead(
    server: Any, gateway: Any, engine: Any, tok: Any, requests: int, max_tokens: int
) -> dict[str, Any]:
    """The overhead arms (module docstring): per arm requests, p50_s, p99_s, overhead_p50_ms, overhead_p99_ms;
    the remote arms also the CPU milliseconds per request of the gateway's process and of the client's."""
    _direct(engine, tok, 10, max_tokens)  # warm-up
    arms = {
        "direct": _latency_summary(_direct(engine, tok, requests, max_tokens)),
        "in-process": _latency_summary(_in_process(server, gateway, requests, max_tokens)),
        "grpc": _remote_arm("grpc", server.grpc_address, requests, max_tokens),
        "http": _remote_arm("http", server.http_url, requests, max_tokens),
    }
    for s in arms.values():
        s["overhead_p50_ms"] = (s["p50_s"] - arms["direct"]["p50_s"]) * 1e3
        s["overhead_p99_ms"] = (s["p99_s"] - arms["direct"]["p99_s"]) * 1e3
    return arms


async def _load_clients(
    target: str, clients: int, requests: int, max_tokens: int, ready: Any, go: Any
) -> dict[str, Any]:
    """``clients`` concurrent tasks, ``requests`` chat completions each, through one ``openai`` client with a
    connection per task; latencies of the answered ones, errors by kind, timeouts. Sets ``ready`` once the client
    is built, then starts when ``go`` is set."""
    import httpx
    import openai

    pool = httpx.AsyncClient(limits=httpx.Limits(max_connections=clients, max_keepalive_connections=clients))
    client = openai.AsyncOpenAI(
        base_url=target, api_key="none", max_retries=0, timeout=LOAD_TIMEOUT_S, http_client=pool
    )
    lat: list[float] = []
    errors: dict[str, int] = {}
    timeouts = 0
    ready.set()
    await asyncio.to_thread(go.wait)

    async def one(i: int) -> None:
        nonlocal timeouts
        for _ in range(requests):
            t0 = time.perf_counter()
            try:
                await client.chat.completions.create(
                    model=AGENTS[i % 2], messages=PROMPT, max_tokens=max_tokens, temperature=1.0
                )
            except openai.APITimeoutError:
                timeouts += 1
            except openai.APIError as exc:
                kind = f"{type(exc).__name__} {getattr(exc, 'status_code', '')}".strip()
                errors[kind] = errors.get(kind, 0) + 1
            else:
                lat.append(time.perf_counter() - t0)

    t0, cpu0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*[one(i) for i in range(clients)])
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    await client.close()
    return {"latencies": lat, "errors": errors, "timeouts": timeouts, "wall_s": wall, "client_cpu_s": cpu}


def _load_process(
    target: str, clients: int, requests: int, max_tokens: int, q: Any, ready: Any, go: Any
) -> None:
    q.put(asyncio.run(_load_clients(target, clients, requests, max_tokens, ready, go)))


def load(server: Any, gateway: Any, clients: int, requests: int, max_tokens: int) -> dict[str, Any]:
    """The load arm (module docstring): requests, p50_s, p99_s, errors, timeouts, requests_per_s, the loop's lag
    during the arm (loop_lag_ms_p50 / p99 / max) and the gateway's batches."""
    ctx = mp.get_context("spawn")
    q, ready, go = ctx.Queue(), ctx.Event(), ctx.Event()
    p = ctx.Process(target=_load_process, args=(server.http_url, clients, requests, max_tokens, q, ready, go))
    before = gateway.stats()
    p.start()
    try:
        if not ready.wait(120):
            raise TimeoutError("the load client process did not start within 120 s")
        gateway.loop_lag.reset()  # the lag measured is the arm's
        cpu0 = os.times()
        go.set()
        raw = q.get(timeout=1800)
    finally:
        p.join(60)
    cpu1 = os.times()
    after = gateway.stats()
    out = _latency_summary(raw["latencies"])
    out.update(
        clients=clients,
        errors=sum(raw["errors"].values()),
        errors_by_kind=raw["errors"],
        timeouts=raw["timeouts"],
        wall_s=raw["wall_s"],
        client_cpu_s=raw["client_cpu_s"],
        gateway_cpu_s=cpu1.user - cpu0.user + cpu1.system - cpu0.system,
        requests_per_s=len(raw["latencies"]) / raw["wall_s"],
        batches=after["batches"] - before["batches"],
        **{
            k: after[k] for k in ("loop_lag_ms_p50", "loop_lag_ms_p99", "loop_lag_ms_max", "loop_lag_samples")
        },
    )
    return out


def run(requests: int, load_clients: int, load_requests: int, max_tokens: int) -> dict[str, Any]:
    """Both model-free parts over one gateway (the tiny model's tokenizer for both agents); every number."""
    from services.gateway.core.gateway import Gateway
    from services.gateway.core.limits import GatewayLimits
    from services.gateway.server import GatewayServer
    from services.trainer.models.loading import load_tokenizer
    from services.trainer.rollout.engines.instant import InstantRolloutEngine
    from services.trainer.rollout.serving.gateway_backend import EngineBackend

    tok = load_tokenizer()
    engine = InstantRolloutEngine(dict.fromkeys(AGENTS, tok))
    gateway = Gateway(EngineBackend(engine, dict.fromkeys(AGENTS, tok)), GatewayLimits())
    with GatewayServer(gateway, host="127.0.0.1", http_port=0, grpc_port=0) as server:
        out: dict[str, Any] = {"overhead": overhead(server, gateway, engine, tok, requests, max_tokens)}
        if load_clients:
            out["load"] = load(server, gateway, load_clients, load_requests, max_tokens)
    return out


def _ms(value: float | None) -> str:
    """``value`` with two decimals, or nothing when the arm has none."""
    return "" if value is None else f"{value:.2f}"


def table(out: dict[str, Any]) -> str:
    """The overhead table and the load line."""
    header = ["arm (1 client, model-free)", "requests", "p50 ms", "p99 ms", "overhead p50 ms", "overhead p99 ms",
              "gateway CPU ms/request", "client CPU ms/request"]  # fmt: skip
    rows = [
        [f"{arm} (baseline)" if arm == "direct" else arm, s["requests"], f"{s['p50_s'] * 1e3:.3f}",
         f"{s['p99_s'] * 1e3:.3f}", f"{s['overhead_p50_ms']:.3f}", f"{s['overhead_p99_ms']:.3f}",
         _ms(s.get("gateway_cpu_ms_per_request")), _ms(s.get("client_cpu_ms_per_request"))]
        for arm, s in out["overhead"].items()
    ]  # fmt: skip
    lines = [markdown_table(header, rows, "lrrrrrrr")]
    x = out.get("load")
    if x:
        lines += ["", f"load: {x['clients']} requests in flight over HTTP (model-free), {x['requests']} answered, "
                  f"{x['errors']} errors {x['errors_by_kind'] or ''}, {x['timeouts']} timeouts; latency p50 "
                  f"{x['p50_s'] * 1e3:.1f} ms, p99 {x['p99_s'] * 1e3:.1f} ms; {x['requests_per_s']:.0f} requests/s "
                  f"in {x['batches']:.0f} batches; event-loop lag p50 {x['loop_lag_ms_p50']:.1f} ms, p99 "
                  f"{x['loop_lag_ms_p99']:.1f} ms, max {x['loop_lag_ms_max']:.1f} ms; CPU seconds: gateway process "
                  f"{x['gateway_cpu_s']:.1f}, client process {x['client_cpu_s']:.1f}"]  # fmt: skip
    return "\n".join(lines)
