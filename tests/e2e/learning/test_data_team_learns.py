"""End to end, a learning test of a dataset job: `examples/data/pick_team.yaml` trains a leader and an executor
(SmolLM2-135M-Instruct, a LoRA adapter each) on rows of a JSONL file that `scripts/data/make_allocation_data.py`
writes, in a chain workflow; only the leader's column holds the tasks' order, and a row is solved when the
executor names the row's answer and no other task (the `regex` verifier). The rewards come from the example's
reward function (the named task's value over the best value, plus 0.5 for naming one task).

The file holds the 120 distinct `pick` problems once each, and 24 of them are held out (`dataset.eval_fraction`
0.2), so no held-out row shows the agents what a training row shows (the job's log would warn, and the test fails
on that warning). Held-out accuracy (the team's final answer on the held-out rows) must rise from the untrained
team's to at least :data:`AFTER` within :data:`STEPS` steps, on all :data:`EPISODES` held-out rows, with at least 3
different answers among the solved rows (no constant answer). Runs are bit-reproducible on one machine
(tests/e2e/jobs/test_seeded_runs.py); this one went 0.208 -> 0.833, and with ``learning_rate`` 1e-12 (the config
refuses 0) 0.208 -> 0.208 (docs/benchmarks.md, "Tasks from data"). On the earlier file of 240 rows (100 distinct
problems, 20 of the 24 held-out rows repeating a training row) it went 0.292 -> 0.833. After 3 steps on 12 rows, as
the test first had it, runs before the seeded-runs fix ranged over 0.67-0.83, too near the bar of 0.75.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "examples" / "data" / "pick_team.yaml"
MAKE_DATA = ROOT / "scripts" / "data" / "make_allocation_data.py"
pytestmark = pytest.mark.slow
#: Held-out accuracy the untrained team stays at or below, and the trained team must reach.
BEFORE, AFTER = 0.5, 0.75
STEPS, EPISODES = 2, 24


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def train(tmp_path: Path, *overrides: str) -> Path:
    """Make the data in ``tmp_path/data`` and run the example job on it from the repository root (where its
    reward function's path is relative to); returns its run folder."""
    made = subprocess.run(
        [sys.executable, str(MAKE_DATA), "--kind", "pick", "--count", "120", "--out",
         "data/private_allocation_pick.jsonl"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "marti.command.main", "train", str(CONFIG), "--no-progress",
        "--set", f"output.dir={run_dir}", "--set", f"max_steps={STEPS}", "--set", f"rollout.eval_every={STEPS}",
        "--set", f"rollout.eval_episodes={EPISODES}",
        "--set", f"dataset.path=jsonl:{tmp_path / 'data' / 'private_allocation_pick.jsonl'}", *overrides,
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # held out means unseen: no held-out row shows the agents what a training row shows (the split's warning)
    assert "held-out rows have" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    return run_dir


@pytest.mark.timeout(1000)
def test_the_team_learns_the_rows_of_a_data_file(tmp_path):
    run_dir = train(tmp_path)
    evals = {r["step"]: r["table"]["team/task_completion"] for r in _records(run_dir / "eval.jsonl")}
    assert sorted(evals) == [0, STEPS], evals
    assert evals[0] <= BEFORE and evals[STEPS] >= AFTER, evals

    last = [e for e in _records(run_dir / "eval_episodes.jsonl") if e["step"] == STEPS]
    assert len(last) == EPISODES
    solved = {
        re.findall(r"task_\d+", e["turns"][1]["text"])[0] for e in last if e["metrics"]["task_completion"]
    }
    assert len(solved) >= 3, solved  # not one constant answer

    cfg = (run_dir / "config.yaml").read_text()
    assert "private_allocation_pick.jsonl" in cfg and "dataset_task" in cfg
    report = (run_dir / "report.md").read_text()
    assert re.search(rf"held-out seeds \(step 0 to step {STEPS}\) went from [0-9.]+ to [0-9.]+", report), (
        report
    )
