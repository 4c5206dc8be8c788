"""``marti bench store``: experience store throughput vs DeepMind Reverb and an in-process deque.

One run measures, for items of 4 KB and 64 KB and 1 and 4 client processes:
  - inserts/s: every item sent on one stream and confirmed by the end (marti: one ``share_experiences`` call
    with 16 items per stream message; Reverb: ``TrajectoryWriter`` append + create_item, flushed at the end), and
    the client processes' CPU time per insert (``time.process_time`` around the insert loop: what the client
    library costs); marti also with one ``share_experiences`` call per 16 items, each waiting for its
    confirmation before the next is sent (``inserts_per_s_16_per_call``: nothing in flight across calls),
  - samples/s and p50/p99 latency of one ``sample(table, batch_size=16)`` call (a new stream per call),
  - samples/s of one streaming sample call per client (3200 items; Reverb: one ``client.sample`` generator),
against (a) Reverb 0.14 (installed by this benchmark into its own virtualenv, ``~/.cache/marti-bench``) and
(b) a Python ``collections.deque`` in the benchmark process (no network, no serialization: the ceiling).
It also measures the store's restart time for 100k items on a SQLite data dir. Results: printed table, ratios and
targets, and with ``--json PATH`` every number (per-row marti/Reverb ratios, the targets with ``met``, the load
average before and after) as strict JSON.

Item content: marti items are one-turn trajectories of ``size // 4`` random token ids, which the SDK packs as
int32 (4 bytes each), so the token payload is exactly the item size; Reverb items are random ``uint8`` arrays of
exactly the item size.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections import deque
from pathlib import Path

from benchmarks.report import (
    bench_parser,
    check_json_path,
    markdown_table,
    non_negative_int,
    positive_int,
    positive_int_list,
    write_json,
)
from benchmarks.server import Server

ROOT = Path(__file__).resolve().parent.parent
REVERB_VENV = Path(os.environ.get("MARTI_REVERB_VENV", Path.home() / ".cache/marti-bench/reverb-venv"))
REVERB_PIP = ["dm-reverb[tensorflow]==0.14.0", "tensorflow==2.15.*"]
SAMPLE_BATCH = 16

_REVERB_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np
    import reverb
    mode = sys.argv[1]
    if mode == "server":
        table = reverb.Table(name="bench", sampler=reverb.selectors.Uniform(), remover=reverb.selectors.Fifo(),
                             max_size=10_000_000, rate_limiter=reverb.rate_limiters.MinSize(1))
        server = reverb.Server(tables=[table], port=None)
        print("PORT", server.port, flush=True)
        server.wait()
    else:
        addr, size, n_items, n_calls, batch = sys.argv[2], *map(int, sys.argv[3:7])
        client = reverb.Client(addr)
        rng = np.random.default_rng()
        data = [rng.integers(0, 256, size, dtype=np.uint8) for _ in range(64)]
        t0, c0 = time.perf_counter(), time.process_time()
        with client.trajectory_writer(num_keep_alive_refs=1) as w:
            for i in range(n_items):
                w.append({"x": data[i % 64]})
                w.create_item("bench", 1.0, {"x": w.history["x"][-1]})
            w.flush()
        t_ins, cpu_ins = time.perf_counter() - t0, time.process_time() - c0
        lat = []
        t0 = time.perf_counter()
        for _ in range(n_calls):
            s = time.perf_counter()
            got = list(client.sample("bench", num_samples=batch))
            assert len(got) == batch
            lat.append(time.perf_counter() - s)
        t_smp = time.perf_counter() - t0
        n_stream = int(sys.argv[7])
        t0 = time.perf_counter()
        got = sum(1 for _ in client.sample("bench", num_samples=n_stream))
        assert got == n_stream
        t_stream = time.perf_counter() - t0
        print("RESULT", json.dumps({"insert_s": t_ins, "insert_cpu_s": cpu_ins, "sample_s": t_smp, "lat": lat,
                                    "stream_s": t_stream}), flush=True)
    """
)


def _tokens_for(size_bytes: int, seed: int) -> list[int]:
    """``size_bytes // 4`` random token ids: packed as int32 they take exactly ``size_bytes``."""
    rng = random.Random(seed)
    return [rng.randrange(1 << 14, 1 << 21) for _ in range(size_bytes // 4)]


def _marti_trajectory(size_bytes: int, i: int):
    from marti.types.trajectory import Trajectory, Turn

    toks = _tokens_for(size_bytes, i % 64)
    return Trajectory(
        episode_id=f"e{i}", agent_id="bench", turns=[Turn(step=0, response_token_ids=toks, reward=1.0)]
    )


def marti_worker(addr: str, size: int, n_items: int, n_calls: int, batch: int, n_stream: int) -> dict:
    """One client process: ``n_items`` confirmed inserts on one stream, ``n_items`` more in calls of 16 that each
    wait for their confirmation, ``n_calls`` sample calls of ``batch`` items, then one streaming sample call of
    ``n_stream`` items."""
    from marti.clients.experience import ExperienceSharingClient

    c = ExperienceSharingClient("bench", addr, timeout_s=120)
    trajs = [_marti_trajectory(size, i) for i in range(64)]
    t0, c0 = time.perf_counter(), time.process_time()
    keys = c.share_experiences([trajs[i % 64] for i in range(n_items)], table="bench", batch_items=16)
    t_ins, cpu_ins = time.perf_counter() - t0, time.process_time() - c0
    if len(keys) != n_items:
        raise RuntimeError("short insert")
    t0 = time.perf_counter()
    for i in range(0, n_items, 16):
        c.share_experiences([trajs[(i + j) % 64] for j in range(min(16, n_items - i))], table="bench")
    t_calls = time.perf_counter() - t0
    lat = []
    t0 = time.perf_counter()
    for _ in range(n_calls):
        s = time.perf_counter()
        got = c.sample("bench", batch)
        lat.append(time.perf_counter() - s)
        if len(got) != batch:
            raise RuntimeError("short sample")
    t_smp = time.perf_counter() - t0
    t0 = time.perf_counter()
    if len(c.sample("bench", n_stream)) != n_stream:
        raise RuntimeError("short stream")
    t_stream = time.perf_counter() - t0
    c.close()
    return {
        "insert_s": t_ins,
        "insert_cpu_s": cpu_ins,
        "insert_16_per_call_s": t_calls,
        "sample_s": t_smp,
        "lat": lat,
        "stream_s": t_stream,
    }


def _spawn(
    cmd: list[str], pattern: str, env: dict | None = None, timeout_s: float = 120
) -> tuple[subprocess.Popen, str]:
    """Start the Reverb baseline's server (not a marti service: the marti store starts through
    :class:`benchmarks.server.Server`) and return it with the first group of ``pattern`` in its output."""
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    deadline = time.monotonic() + timeout_s
    lines = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        lines.append(line)
        m = re.search(pattern, line)
        if m:
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return proc, m.group(1)
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError(f"{cmd[:3]} did not start:\n{''.join(lines[-20:])}")


def _run_clients(cmds: list[list[str]]) -> list[dict]:
    procs = [
        subprocess.Popen(c, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in cmds
    ]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=1800)
        m = re.search(r"RESULT (.*)", stdout)
        if not m:
            raise RuntimeError(f"client failed: {stderr[-2000:]}")
        out.append(json.loads(m.group(1)))
    return out


def _summarize(results: list[dict], n_items: int, n_calls: int, batch: int, n_stream: int = 0) -> dict:
    n = len(results)
    lat = sorted(x for r in results for x in r["lat"])
    stream = n * n_stream / max(r["stream_s"] for r in results) if n_stream else float("nan")
    return {
        "stream_samples_per_s": stream,
        "inserts_per_s": n * n_items / max(r["insert_s"] for r in results),
        "inserts_per_s_16_per_call": (
            n * n_items / max(r["insert_16_per_call_s"] for r in results)
            if all("insert_16_per_call_s" in r for r in results)
            else float("nan")
        ),
        "client_cpu_ms_per_insert": (
            1000 * sum(r["insert_cpu_s"] for r in results) / (n * n_items)
            if all("insert_cpu_s" in r for r in results)
            else float("nan")
        ),
        "samples_per_s": n * n_calls * batch / max(r["sample_s"] for r in results),
        "sample_p50_ms": 1000 * statistics.median(lat),
        "sample_p99_ms": 1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))],
    }


def bench_marti(size: int, clients: int, n_items: int, n_calls: int, n_stream: int, data_dir: str) -> dict:
    """Start a store (SQLite WAL data dir) and run ``clients`` client processes against it."""
    cfg = Path(data_dir) / "tables.yaml"
    cfg.write_text(
        "tables:\n  - {name: bench, preset: uniform, max_size: 10000000, max_bytes: 100000000000}\n"
    )
    with Server("store", ["--data-dir", data_dir, "--config", str(cfg)]) as server:
        cmd = [
            sys.executable,
            "-m",
            "benchmarks.store",
            "--worker",
            server.address,
            str(size),
            str(n_items),
            str(n_calls),
            str(n_stream),
        ]
        return _summarize(_run_clients([cmd] * clients), n_items, n_calls, SAMPLE_BATCH, n_stream)


def ensure_reverb() -> tuple[Path | None, str]:
    """Create the Reverb virtualenv if missing; returns (python, '') or (None, why it cannot run)."""
    py = REVERB_VENV / "bin" / "python"
    if py.exists() and subprocess.run([py, "-c", "import reverb"], capture_output=True).returncode == 0:
        return py, ""
    try:
        subprocess.run([sys.executable, "-m", "venv", str(REVERB_VENV)], check=True, capture_output=True)
        r = subprocess.run([py, "-m", "pip", "install", "-q", *REVERB_PIP], capture_output=True, text=True)
        if r.returncode != 0:
            return None, f"pip install {' '.join(REVERB_PIP)} failed: {r.stderr[-500:]}"
        r = subprocess.run([py, "-c", "import reverb"], capture_output=True, text=True)
        if r.returncode != 0:
            return None, f"import reverb failed: {r.stderr[-500:]}"
    except (OSError, subprocess.CalledProcessError) as e:
        return None, f"could not create the Reverb virtualenv: {e}"
    return py, ""


def bench_reverb(py: Path, size: int, clients: int, n_items: int, n_calls: int, n_stream: int) -> dict:
    """Start a Reverb server (uniform table, MinSize(1)) and run ``clients`` client processes against it."""
    script = Path(tempfile.gettempdir()) / "marti_bench_reverb.py"
    script.write_text(_REVERB_SCRIPT)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    server, port = _spawn([str(py), str(script), "server"], r"PORT (\d+)", env=env)
    try:
        cmd = [
            str(py),
            str(script),
            "worker",
            f"localhost:{port}",
            str(size),
            str(n_items),
            str(n_calls),
            str(SAMPLE_BATCH),
            str(n_stream),
        ]
        return _summarize(_run_clients([cmd] * clients), n_items, n_calls, SAMPLE_BATCH, n_stream)
    finally:
        server.kill()
        server.wait()


def bench_deque(size: int, n_items: int, n_calls: int) -> dict:
    """In-process ceiling: append trajectories to a deque, sample ``SAMPLE_BATCH`` with ``random.choices``."""
    trajs = [_marti_trajectory(size, i) for i in range(64)]
    buf: deque = deque(maxlen=10_000_000)
    t0 = time.perf_counter()
    for i in range(n_items):
        buf.append(trajs[i % 64])
    t_ins = time.perf_counter() - t0
    lat = []
    t0 = time.perf_counter()
    for _ in range(n_calls):
        s = time.perf_counter()
        random.choices(buf, k=SAMPLE_BATCH)
        lat.append(time.perf_counter() - s)
    t_smp = time.perf_counter() - t0
    t0 = time.perf_counter()
    random.choices(buf, k=n_calls * SAMPLE_BATCH)
    res = {"insert_s": t_ins, "sample_s": t_smp, "lat": lat, "stream_s": time.perf_counter() - t0}
    return _summarize([res], n_items, n_calls, SAMPLE_BATCH, n_calls * SAMPLE_BATCH)


def bench_restart(n_items: int, size: int, data_dir: str) -> dict:
    """Fill a SQLite data dir with ``n_items`` items of ``size`` bytes, then time a store restart: the restore in
    this process (``restore_s``), and a store process from its start until it listens and answers SERVING
    (``process_start_to_serving_s``, :class:`benchmarks.server.Server`)."""
    from marti.types.experience import parse_table_config
    from marti.types.trajectory import summarize
    from services.experience_store.core.storage import SqliteStorage
    from services.experience_store.core.store import ExperienceStore
    from services.experience_store.core.table_records import NewItem

    cfg = [parse_table_config({"name": "bench", "preset": "prioritized", "max_size": 10_000_000})]
    store = ExperienceStore(SqliteStorage(data_dir), cfg)
    payload = os.urandom(size)
    summary = summarize(_marti_trajectory(64, 0))
    for i in range(0, n_items, 1000):
        store.insert(
            "bench", [NewItem(payload, summary, 1.0 + (i % 7)) for _ in range(min(1000, n_items - i))], 0
        )
    store.close()
    t0 = time.perf_counter()
    store = ExperienceStore(SqliteStorage(data_dir), cfg)
    t_core = time.perf_counter() - t0
    assert len(store.table("bench")) == n_items
    store.close()
    t0 = time.perf_counter()
    with Server("store", ["--data-dir", data_dir]):
        t_proc = time.perf_counter() - t0
    return {"items": n_items, "item_bytes": size, "restore_s": t_core, "process_start_to_serving_s": t_proc}


#: The count options: (flag, argparse type, default, help).
COUNT_OPTIONS = (
    ("--items-4k", positive_int, 4000, "inserts per client for 4 KB items"),
    ("--items-64k", positive_int, 1000, "inserts per client for 64 KB items"),
    ("--sample-calls", positive_int, 50, "sample calls per client (16 items each)"),
    ("--stream-samples", positive_int, 3200, "items per client in one streaming sample call"),
    ("--restart-items", non_negative_int, 100_000, "items for the restart measurement (0 = skip)"),
)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table (see the module docstring)."""
    p = bench_parser("store", __doc__)
    p.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    for flag, kind, default, what in COUNT_OPTIONS:
        p.add_argument(flag, type=kind, default=default, help=what)
    p.add_argument(
        "--clients", type=positive_int_list, default=[1, 4], help="comma-separated client process counts"
    )
    p.add_argument("--no-reverb", action="store_true", help="skip the Reverb baseline")
    p.add_argument("--json", "--out", metavar="PATH", help="write every number to PATH as JSON")
    args = p.parse_args(argv)
    if args.worker:
        addr, size, n_items, n_calls, n_stream = args.worker
        print(
            "RESULT",
            json.dumps(
                marti_worker(addr, int(size), int(n_items), int(n_calls), SAMPLE_BATCH, int(n_stream))
            ),
            flush=True,
        )
        return 0
    check_json_path(p, args.json)
    reverb_py, why = (None, "skipped (--no-reverb)") if args.no_reverb else ensure_reverb()
    load_before = [round(x, 2) for x in os.getloadavg()]
    print("load average before: " + " ".join(f"{x:.2f}" for x in load_before), flush=True)
    rows = []
    for size, n_items in ((4096, args.items_4k), (65536, args.items_64k)):
        for clients in args.clients:
            print(f"{size // 1024} KB items x {clients} clients ...", flush=True)
            with tempfile.TemporaryDirectory() as d:
                m = bench_marti(size, clients, n_items, args.sample_calls, args.stream_samples, d)
            r = (
                bench_reverb(reverb_py, size, clients, n_items, args.sample_calls, args.stream_samples)
                if reverb_py
                else None
            )
            q = bench_deque(size, n_items * clients, args.sample_calls * clients)
            rows.append(
                {
                    "item_bytes": size,
                    "clients": clients,
                    "marti": m,
                    "reverb": r,
                    "deque": q,
                    "ratios": _ratios(m, r),
                }
            )
    print()
    print(table(rows))
    restart = None
    if args.restart_items:
        with tempfile.TemporaryDirectory() as d:
            restart = bench_restart(args.restart_items, 4096, d)
        print(f"\nrestart with {restart['items']} items of 4 KB: restore {restart['restore_s']:.2f} s, "
              f"process start to serving {restart['process_start_to_serving_s']:.2f} s")  # fmt: skip
    if not reverb_py:
        print(f"\nReverb baseline not run: {why}")
    targets = [
        {
            "target": "marti inserts/s >= Reverb's",
            "item_bytes": row["item_bytes"],
            "clients": row["clients"],
            "ratio": row["ratios"]["inserts"],
            "met": row["ratios"]["inserts"] >= 1,
        }
        for row in rows
        if row["ratios"] is not None
    ]
    for t in targets:
        print(f"inserts marti/Reverb, {t['item_bytes'] // 1024} KB x {t['clients']} clients: {t['ratio']:.2f}"
              f"   (target >= 1: {'met' if t['met'] else 'missed'})")  # fmt: skip
    load_after = [round(x, 2) for x in os.getloadavg()]
    print("load average after: " + " ".join(f"{x:.2f}" for x in load_after))
    result = {
        "benchmark": "store",
        "rows": rows,
        "targets": targets,
        "restart": restart,
        "reverb_note": why,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "cpus": os.cpu_count(),
    }
    if args.json:
        write_json(args.json, result)
        print(f"wrote {args.json}")
    return 0


def _ratios(m: dict, r: dict | None) -> dict | None:
    """marti over Reverb for one row (inserts, samples and streaming samples per second); None without Reverb."""
    if r is None:
        return None
    keys = {"inserts": "inserts_per_s", "samples": "samples_per_s", "stream_samples": "stream_samples_per_s"}
    return {name: m[k] / r[k] if r[k] else float("nan") for name, k in keys.items()}


#: The columns of :func:`table`: per measure, marti (``m``), Reverb (``r``), the deque and marti/Reverb (``m/r``).
TABLE_HEADER = ["item", "cl", "marti ins/s", "reverb ins/s", "deque ins/s", "ins m/r", "marti smp/s",
                "reverb smp/s", "deque smp/s", "smp m/r", "stream m", "stream r", "stream m/r", "p99 ms m", "p99 ms r",
                "cli ms/ins m", "cli ms/ins r", "m 16/call"]  # fmt: skip


def table(rows: list[dict]) -> str:
    """The measured rows (one per item size and client count, as in ``--json``) as a Markdown table
    (:func:`benchmarks.report.markdown_table`); ``n/a`` where Reverb was not run."""
    return markdown_table(TABLE_HEADER, [_cells(row) for row in rows], "r" * len(TABLE_HEADER))


def _cells(row: dict) -> list[str]:
    """One row of :func:`table`: rates as whole numbers, ratios with 2 decimals, milliseconds with 2 or 3."""
    m, r, q, ratios = row["marti"], row["reverb"], row["deque"], row["ratios"]

    def num(side: dict | None, key: str, spec: str = ".0f") -> str:
        return "n/a" if side is None else format(side[key], spec)

    def ratio(name: str) -> str:
        return "n/a" if ratios is None else f"{ratios[name]:.2f}"

    return [
        f"{row['item_bytes'] // 1024}KB", str(row["clients"]),
        num(m, "inserts_per_s"), num(r, "inserts_per_s"), num(q, "inserts_per_s"), ratio("inserts"),
        num(m, "samples_per_s"), num(r, "samples_per_s"), num(q, "samples_per_s"), ratio("samples"),
        num(m, "stream_samples_per_s"), num(r, "stream_samples_per_s"), ratio("stream_samples"),
        num(m, "sample_p99_ms", ".2f"), num(r, "sample_p99_ms", ".2f"),
        num(m, "client_cpu_ms_per_insert", ".3f"), num(r, "client_cpu_ms_per_insert", ".3f"),
        num(m, "inserts_per_s_16_per_call"),
    ]  # fmt: skip


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
