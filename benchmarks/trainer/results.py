"""The report of a ``marti bench trainer`` run folder (:mod:`benchmarks.trainer`): its side result files read, the
fastest run of each side summarised, the tables printed and saved (``table.md``), and ``--json``."""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path
from typing import Any

from benchmarks.report import write_json
from benchmarks.trainer.report import SIDES, comparisons, format_table, summarize
from benchmarks.trainer.sides import spec_digest
from benchmarks.trainer.thread_report import format_thread_table


def side_files(out: Path) -> dict[Path, str]:
    """The side result files ``<out>/<side>_<rep>.json`` -> their side (:data:`SIDES`)."""
    pattern = re.compile(rf"({'|'.join(SIDES)})_\d+\.json")
    found = {f: pattern.fullmatch(f.name) for f in sorted(out.glob("*_*.json"))}
    return {f: m.group(1) for f, m in found.items() if m}


def print_report(args: argparse.Namespace, out: Path) -> int:
    """Print and save (``<out>/table.md``) the tables of the side results ``<out>/<side>_<rep>.json``: the
    comparison (:func:`~benchmarks.trainer.report.format_table`) and where the time goes, per thread
    (:func:`~benchmarks.trainer.thread_report.format_thread_table`); with ``--json``, also as JSON."""
    spec = json.loads((out / "spec.json").read_text())
    if not (out / "init_eval.json").is_file():
        raise SystemExit(
            f"no init_eval.json in {out}: the run stopped before the untrained model was evaluated"
        )
    init_eval = json.loads((out / "init_eval.json").read_text())
    steps = spec["steps"]
    tail = max(1, steps // 4)
    results: dict[str, list[dict[str, Any]]] = {}
    digest = spec_digest(spec)
    for f, side in side_files(out).items():
        result = json.loads(f.read_text())
        if "train_time_s" not in result:
            raise SystemExit(f"{f} is not a side result of this bench (no train_time_s)")
        if result.get("spec_digest", digest) != digest:  # files written before the digest carry none
            raise SystemExit(
                f"{f} was run with other settings than {out / 'spec.json'} (its spec_digest differs): a side "
                "file copied from another run folder must come from a run of the same command"
            )
        results.setdefault(side, []).append(result)
    if not results:
        names = ", ".join(f"{s}_*.json" for s in SIDES)
        raise SystemExit(f"no side results in {out} ({names}): the run did not finish a side")
    rows = []
    for side in (s for s in SIDES if s in results):
        best = min(results[side], key=lambda r: r["train_time_s"])  # least disturbed by other load
        rows.append(summarize(side, best, tail))
    reps = max(len(v) for v in results.values())
    print(
        f"\nmodel {spec.get('model', args.model)}, N={steps} steps x {spec['prompts_per_step']} prompts x "
        f"G={spec['group_size']}, "
        f"max_new_tokens={spec['max_new_tokens']}, T={spec['temperature']}, lr={spec['lr']}, "
        f"{'LoRA r=8' if spec['lora'] else 'full fine-tuning'}, {spec['threads']} threads, seed {spec['seed']}, "
        f"ours with rollout.engine {spec.get('rollout_engine', 'hf')} and rollout.dtype "
        f"{spec.get('rollout_dtype', 'float32')}, update in {spec.get('train_dtype', 'float32')}, "
        f"fastest of {reps} run(s) per side\n"
    )
    text = format_table(rows, init_eval, steps, tail) + "\n\n" + format_thread_table(rows, spec["threads"])
    print(text)
    (out / "table.md").write_text(text + "\n")
    if args.json:
        doc = {
            "bench": "trainer",
            "spec": {k: v for k, v in spec.items() if not k.endswith("_problems")},
            "untrained_eval": init_eval,
            "sides": rows,
            "comparisons": comparisons(rows),
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        }
        write_json(args.json, doc)
        print(f"wrote {args.json}")
    return 0
