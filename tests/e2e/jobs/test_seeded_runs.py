"""Two seeded synchronous runs of the same job on the CPU log the same numbers, bit for bit (docs/ARCHITECTURE.md,
"Synchronous or asynchronous"): the tiny model's job (examples/tiny.yaml) with one GRPO group of 6 a step, trained
as one micro-batch whose rows share their prompt's computation (``policy.share_prompt_prefix``), run twice as a user
runs it. Timings and process figures are left out; every other metric must be equal.

At this model's size the job stayed reproducible even with the shared prompt's rows gathered by ``tensor[rows]``;
on SmolLM2-135M that gather made two runs of examples/data/pick_team.yaml differ from step 1 (their held-out accuracy
after 3 steps 0.75 and 0.67): tests/unit/trainer/models/test_prefix_sharing.py::test_shared_gradients_are_the_same_bits_every_time
holds that case."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.slow
#: Metric names that measure the machine, not the run (timings, rates, processes).
MACHINE = ("time", "per_s", "system/", "services/")


def _metrics(run: Path) -> dict[int, dict[str, float]]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {
        r["step"]: {k: v for k, v in r["metrics"].items() if not any(m in k for m in MACHINE)}
        for r in records
    }


def _train(run: Path) -> dict[int, dict[str, float]]:
    sets = ("max_steps=2", "rollout.episodes_per_step=6", "rollout.group_size=6", "micro_train_batch_size=6", "rollout.eval_every=0",
            "environment.max_turns=1", f"output.dir={run}")  # fmt: skip
    cmd = [sys.executable, "-m", "marti.command.main", "train", "examples/tiny.yaml", "--no-progress"]
    proc = subprocess.run(
        [*cmd, *[a for s in sets for a in ("--set", s)]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return _metrics(run)


@pytest.mark.timeout(900)
def test_two_seeded_runs_log_the_same_numbers(tmp_path):
    first, second = _train(tmp_path / "a"), _train(tmp_path / "b")
    assert sorted(first) == [1, 2]
    assert "agent_1/policy_loss" in first[2] and "agent_1/grad_norm" in first[2]
    differ = {
        (step, k): (v, second[step].get(k))
        for step, m in first.items()
        for k, v in m.items()
        if second[step].get(k) != v
    }
    assert not differ, differ
