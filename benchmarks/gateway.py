"""``marti bench gateway``: what serving through the inference gateway costs against calling the engine directly.

One process hosts the gateway (:class:`services.gateway.server.GatewayServer`: OpenAI-compatible HTTP and gRPC on
one event loop) over a transformers engine with two agents (the tiny random model by default, ``--model`` for
another); the clients run in **another process** (asyncio, one task per client, each sending its requests one
after the other), so client work does not share the server's interpreter. For each number of concurrent clients
``c`` (``--clients``, default 1, 8 and 32) three arms generate the same number of responses of ``--max-tokens``
tokens for the same prompt:

* ``direct`` (the baseline): ``engine.generate`` called in this process with a batch of ``c`` prompts, as the
  gateway's batcher would at best; latency is one batch's time;
* ``http``: ``c`` concurrent clients, each ``--requests`` chat completions through the official ``openai`` client;
* ``grpc``: the same with :class:`marti.AsyncInferenceClient`;
* ``in-process``: ``c`` concurrent ``Gateway.generate`` calls on the gateway's own event loop (batching and
  tracing without HTTP, gRPC or a client process), so the cost of the adapters and the clients shows apart.

Printed per ``c``: latency p50 and p99 (seconds per request), generated tokens per second, and each arm's
throughput as a ratio of ``direct``'s (the issue's target is >= 0.8 at 32 clients). Then trace capture: episodes of
two calls each are reported over HTTP and inserted into a real experience store (``marti store``, a local
process) through an :class:`services.trainer.data.episode_writer.EpisodeWriter`, as a training job does; traces per
second is reported episodes over the wall time of the reports. ``--json PATH`` writes every number; the load
average before and after is printed.

Then the model-free arms (:mod:`benchmarks.gateway_load`): the gateway's overhead per request at 1 client (HTTP,
gRPC and in-process against a direct call of an engine that answers at once) and ``--load-clients`` requests in
flight over HTTP (errors, timeouts, latency and the event loop's lag). ``--arms`` runs only one part.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.report import (
    bench_parser,
    check_json_path,
    markdown_table,
    non_negative_int,
    positive_int,
    positive_int_list,
    print_report,
)

BASELINE = "direct"
AGENTS = ("alice", "bob")
PROMPT = [{"role": "user", "content": "Name three colours of the rainbow."}]


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


async def _clients(
    kind: str, target: str, token: str, c: int, requests: int, max_tokens: int
) -> dict[str, Any]:
    """``c`` concurrent clients of ``kind`` (http or grpc), ``requests`` each; latencies and tokens.

    Each client is built and sends one untimed request first (connections, imports, first batches), as the
    direct arm's engine is warmed up before it is timed."""
    import openai

    from marti.clients.inference import AsyncInferenceClient

    lat: list[float] = []
    tokens = 0
    if kind == "http":
        clients: list[Any] = [
            openai.AsyncOpenAI(base_url=target, api_key=token or "none", max_retries=0, timeout=600)
            for _ in range(c)
        ]
    else:
        clients = [AsyncInferenceClient(target, token=token or None) for _ in range(c)]

    async def one(i: int, n: int) -> None:
        nonlocal tokens
        for _ in range(n):
            t0 = time.perf_counter()
            if kind == "http":
                r = await clients[i].chat.completions.create(
                    model=AGENTS[i % 2], messages=PROMPT, max_tokens=max_tokens, temperature=1.0
                )
                got = r.usage.completion_tokens
            else:
                g = await clients[i].generate(
                    AGENTS[i % 2], messages=PROMPT, max_tokens=max_tokens, temperature=1.0
                )
                got = sum(len(ch.token_ids) for ch in g.choices)
            lat.append(time.perf_counter() - t0)
            tokens += got

    await asyncio.gather(*[one(i, 1) for i in range(c)])  # warm-up, untimed
    lat.clear()
    tokens = 0
    t0, cpu0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*[one(i, requests) for i in range(c)])
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    for client in clients:
        await client.close()
    return {"latencies": lat, "tokens": tokens, "wall_s": wall, "client_cpu_s": cpu}


def _client_process(
    kind: str, target: str, token: str, c: int, requests: int, max_tokens: int, q: Any
) -> None:
    q.put(asyncio.run(_clients(kind, target, token, c, requests, max_tokens)))


def _remote(kind: str, target: str, token: str, c: int, requests: int, max_tokens: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_client_process, args=(kind, target, token, c, requests, max_tokens, q))
    p.start()
    try:
        out = q.get(timeout=1800)
    finally:
        p.join(60)
    return out


def _direct(engine: Any, c: int, requests: int, max_tokens: int) -> dict[str, Any]:
    from marti.types.inference import SamplingParams
    from services.trainer.rollout.engines.base import chat_to_ids

    lat: list[float] = []
    tokens = 0
    sampling = SamplingParams(max_new_tokens=max_tokens, temperature=1.0)
    t_all = time.perf_counter()
    for _ in range(requests):
        for agent in AGENTS[: min(2, c)]:  # the clients alternate agents: half the batch each
            n = (c + 1) // 2 if agent == AGENTS[0] else c // 2
            ids = chat_to_ids(engine._agents[agent].tokenizer, PROMPT)
            t0 = time.perf_counter()
            gens = engine.generate(agent, [ids] * n, sampling)
            dt = time.perf_counter() - t0
            lat.extend([dt] * n)
            tokens += sum(len(g.response_token_ids) for g in gens)
    return {"latencies": lat, "tokens": tokens, "wall_s": time.perf_counter() - t_all}


def _in_process(server: Any, gateway: Any, c: int, requests: int, max_tokens: int) -> dict[str, Any]:
    """``c`` concurrent callers of ``Gateway.generate`` on the server's own event loop: the batcher and trace
    path without HTTP, gRPC or a client process (what the adapters and the clients add is the difference)."""
    from marti.types.inference import SamplingParams

    sampling = SamplingParams(max_new_tokens=max_tokens, temperature=1.0)

    async def go() -> dict[str, Any]:
        lat: list[float] = []
        tokens = 0

        async def one(i: int) -> None:
            nonlocal tokens
            for _ in range(requests):
                t0 = time.perf_counter()
                out = await gateway.generate(AGENTS[i % 2], PROMPT, sampling)
                lat.append(time.perf_counter() - t0)
                tokens += len(out.generations[0].response_token_ids)

        t0 = time.perf_counter()
        await asyncio.gather(*[one(i) for i in range(c)])
        return {"latencies": lat, "tokens": tokens, "wall_s": time.perf_counter() - t0}

    return server.run(go(), timeout_s=1800)


def _summary(raw: dict[str, Any]) -> dict[str, Any]:
    lat = raw["latencies"]
    return {
        "requests": len(lat),
        "p50_s": statistics.median(lat),
        "p99_s": _pct(lat, 0.99),
        "tokens": raw["tokens"],
        "wall_s": raw["wall_s"],
        "tokens_per_s": raw["tokens"] / raw["wall_s"],
    }


def _traces(http: str, token: str, episodes: int, max_tokens: int) -> dict[str, Any]:
    """Play ``episodes`` two-call episodes over HTTP, then time their reward reports (inserts into the store)."""
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    root = http.removesuffix("/v1")
    with httpx.Client(timeout=600, headers=headers) as client:
        ids = []
        for _ in range(episodes):
            eid = uuid.uuid4().hex
            for agent in AGENTS:
                r = client.post(
                    f"{root}/v1/chat/completions",
                    headers={"X-Marti-Episode": eid},
                    json={"model": agent, "messages": PROMPT, "max_tokens": max_tokens},
                )
                r.raise_for_status()
            ids.append(eid)
        t0 = time.perf_counter()
        for eid in ids:
            client.post(
                f"{root}/v1/episodes/{eid}/reward", json={"rewards": {a: 1.0 for a in AGENTS}}
            ).raise_for_status()
        dt = time.perf_counter() - t0
    return {"episodes": episodes, "report_wall_s": dt, "traces_per_s": episodes / dt}


def run(model: str, clients: list[int], requests: int, max_tokens: int, episodes: int) -> dict[str, Any]:
    """Measure every arm over the model (see module docstring) and return every number."""
    from marti.clients.experience import ExperienceSharingClient
    from marti.command.stack import LocalStack
    from services.gateway.core.gateway import Gateway
    from services.gateway.core.limits import GatewayLimits
    from services.gateway.server import GatewayServer
    from services.trainer.data.episode_writer import EpisodeWriter
    from services.trainer.data.external import ExternalEpisodes
    from services.trainer.data.tables import claim_tables
    from services.trainer.models.loading import build_tiny_model, load_model, load_tokenizer
    from services.trainer.rollout.engines.hf import AgentModel, HFRolloutEngine
    from services.trainer.rollout.serving.gateway_backend import EngineBackend

    if model == "tiny-llama":
        tok = load_tokenizer()
        models = {a: build_tiny_model(tok, seed=i) for i, a in enumerate(AGENTS)}
    else:
        tok = load_tokenizer(model)
        models = {a: load_model(model) for a in AGENTS}
    engine = HFRolloutEngine({a: AgentModel(m, tok) for a, m in models.items()}, max_batch_size=max(clients))
    out: dict[str, Any] = {"by_clients": {}}
    with (
        tempfile.TemporaryDirectory(prefix="marti-bench-gateway-") as logs,
        LocalStack(services=("store",), log_dir=Path(logs)) as stack,
    ):
        store = ExperienceSharingClient("bench", stack.addresses["store"])

        def direct(fn, what):
            return fn()

        name = f"bench-{uuid.uuid4().hex[:6]}"
        tables, _ = claim_tables(store, name, dict.fromkeys(AGENTS, 0), 100_000, direct)
        feed = EpisodeWriter(store, tables, direct, ExternalEpisodes(list(AGENTS)))
        limits = GatewayLimits(max_batch=max(clients), max_wait_ms=5.0, max_queue=4 * max(clients))
        gateway = Gateway(EngineBackend(engine, dict.fromkeys(AGENTS, tok)), limits, sink=feed.insert_episode)
        server = GatewayServer(gateway, host="127.0.0.1", http_port=0, grpc_port=0)
        http, grpc_addr = server.start()
        try:
            _direct(engine, 2, 1, max_tokens)  # warm-up
            for c in clients:
                arms = {
                    BASELINE: _summary(_direct(engine, c, requests, max_tokens)),
                    "http": _summary(_remote("http", http, "", c, requests, max_tokens)),
                    "grpc": _summary(_remote("grpc", grpc_addr, "", c, requests, max_tokens)),
                    "in-process": _summary(_in_process(server, gateway, c, requests, max_tokens)),
                }
                for s in arms.values():
                    s["ratio_tokens_per_s"] = s["tokens_per_s"] / arms[BASELINE]["tokens_per_s"]
                out["by_clients"][str(c)] = arms
            out["traces"] = _traces(http, "", episodes, max_tokens)
            out["traces"]["inserted"] = feed.inserted
        finally:
            server.stop()
            store.close()
    out.update({"requests_per_client": requests, "max_tokens": max_tokens})
    return out


def run_all(args: Any, clients: list[int]) -> dict[str, Any]:
    """The parts ``args.arms`` names (``model``, ``model-free`` or ``all``); every number (what ``--json``
    writes), the load average before and after the whole run."""
    from benchmarks import gateway_load

    load_before = os.getloadavg()
    out: dict[str, Any] = {
        "benchmark": "gateway",
        "model": args.model,
        "baseline": BASELINE,
        "by_clients": {},
    }
    if args.arms in ("all", "model"):
        out.update(run(args.model, clients, args.requests, args.max_tokens, args.episodes))
    if args.arms in ("all", "model-free"):
        out["model_free"] = gateway_load.run(
            args.overhead_requests, args.load_clients, args.load_requests, args.max_tokens
        )
    out["loadavg_before"] = [round(x, 2) for x in load_before]
    out["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    return out


def table(out: dict[str, Any]) -> str:
    """The markdown table: one row per (clients, arm)."""
    header = ["clients", "arm", "requests", "p50 s", "p99 s", "tokens/s", f"arm / {BASELINE}, tokens/s"]
    rows = [
        [c, f"{arm} (baseline)" if arm == BASELINE else arm, s["requests"], f"{s['p50_s']:.4f}", f"{s['p99_s']:.4f}",
         f"{s['tokens_per_s']:.1f}", f"{s['ratio_tokens_per_s']:.2f}x"]
        for c, arms in out["by_clients"].items()
        for arm, s in arms.items()
    ]  # fmt: skip
    lines = [markdown_table(header, rows, "rlrrrrr")] if rows else []
    t = out.get("traces")
    if t:
        lines += ["", f"trace capture: {t['episodes']} episodes reported and inserted into the store in "
                  f"{t['report_wall_s']:.3f} s: {t['traces_per_s']:.1f} traces/s ({t['inserted']} items)"]  # fmt: skip
    if "model_free" in out:
        from benchmarks import gateway_load

        lines += ["", gateway_load.table(out["model_free"])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the table (and write ``--json``); returns 0."""
    p = bench_parser("gateway", __doc__)
    p.add_argument("--model", default="tiny-llama", help="tiny-llama (default) or smollm2-135m-instruct")
    p.add_argument(
        "--clients",
        type=positive_int_list,
        default=[1, 8, 32],
        help="comma-separated concurrent clients, each once (default 1,8,32)",
    )
    p.add_argument("--requests", type=positive_int, default=4, help="requests per client (default 4)")
    p.add_argument("--max-tokens", type=positive_int, default=16, help="tokens per response (default 16)")
    p.add_argument(
        "--episodes", type=positive_int, default=50, help="episodes for the trace-capture rate (default 50)"
    )
    p.add_argument(
        "--arms",
        choices=("all", "model", "model-free"),
        default="all",
        help="which part to run (default all)",
    )
    p.add_argument(
        "--overhead-requests", type=positive_int, default=200,
        help="model-free calls per overhead arm at 1 client (default 200)",
    )  # fmt: skip
    p.add_argument(
        "--load-clients", type=non_negative_int, default=400,
        help="model-free requests in flight over HTTP (default 400; 0 skips the load arm)",
    )  # fmt: skip
    p.add_argument(
        "--load-requests", type=positive_int, default=2,
        help="requests per load client, one after the other (default 2)",
    )  # fmt: skip
    p.add_argument("--json", metavar="PATH", help="also write every number to PATH as JSON")
    args = p.parse_args(argv)
    check_json_path(p, args.json)
    out = run_all(args, args.clients)
    if args.arms != "model-free":
        print(f"model: {out['model']}; {args.requests} requests per client, {args.max_tokens} tokens each")
    if args.arms != "model":
        print(f"model-free: {args.overhead_requests} overhead calls per arm, {args.load_clients} load clients x "
              f"{args.load_requests} requests, {args.max_tokens} tokens each")  # fmt: skip
    print_report(out, table(out), args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
