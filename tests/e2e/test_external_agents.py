"""End to end: `examples/external_agents/run.sh` trains a team written only against the `openai` package.

The example's agent code (`app.py`) imports no marti module. The job (`rollout.source: external`) serves alice's
and bob's LoRA policies on SmolLM2-135M-Instruct through the gateway; the app plays and rewards 3 rounds of 48
episodes over HTTP, one round per update, and evaluates held-out questions greedily before training and after
the last update (while the gateway lingers). Learning must show for **each** agent, and the targets differ per
agent (alice: answer "yes", bob: answer "no"), so serving one agent's adapter for the other fails the test.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "external_agents"
pytestmark = pytest.mark.slow
#: Each agent's held-out reward must rise at least this much over the untrained policy's.
MARGIN = 0.3
#: Runs (seeds 0, 1, ...) of which one must show the rise for both agents.
ATTEMPTS = 2


def _rewards(line: str) -> dict[str, float]:
    return {a: float(r) for a, r in re.findall(r"(alice|bob)=([0-9.]+)", line)}


def test_the_agent_code_imports_only_openai_and_the_standard_library():
    tree = ast.parse((EXAMPLE / "app.py").read_text())
    names = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])
    }
    assert "openai" in names and not any(n.startswith(("marti", "services")) for n in names), names
    assert names - {"openai"} <= set(sys.stdlib_module_names) | {"__future__"}, names


def _train(run_dir: Path, seed: int) -> tuple[dict[str, float], dict[str, float]]:
    """Run ``run.sh`` with the job seeded ``seed``; check it ran whole; return held-out rewards before and after."""
    env = {**os.environ, "PYTHON": sys.executable, "MARTI": f"{sys.executable} -m marti.cli"}
    env["RUN_DIR"] = str(run_dir)
    proc = subprocess.run(
        [str(EXAMPLE / "run.sh"), "--set", f"seed={seed}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    lines = out.strip().splitlines()
    assert lines[-1] == "trained 3 steps on 144 external episodes", out[-2000:]
    assert "gateway listening on http://" in out
    before = _rewards(next(x for x in lines if x.startswith("untrained")))
    after = _rewards(next(x for x in lines if x.startswith("trained (held-out)")))
    return before, after


@pytest.mark.timeout(ATTEMPTS * 900 + 60)  # each run has its own 900 s limit (the suite's default is 600 s)
def test_run_sh_trains_each_agent_on_external_episodes_and_learning_shows(tmp_path):
    """Learning must show for both agents in one of :data:`ATTEMPTS` runs with different seeds.

    Each agent's target word is rare when sampled at temperature 1 (about 5-20% of samples), so a GRPO group can
    hold no rewarded sample. With groups of 4 a run sometimes went several updates without one for an agent
    (about one run in three failed); the example now plays groups of 8 (README). A second seeded run keeps bad
    luck from failing the suite; every attempt must still run whole."""
    seen = []
    for seed in range(ATTEMPTS):
        before, after = _train(tmp_path / f"run-{seed}", seed)
        seen.append((seed, before, after))
        if all(after[a] >= before[a] + MARGIN for a in ("alice", "bob")):
            return
    pytest.fail(f"no attempt showed a rise of {MARGIN} for both agents: (seed, before, after) = {seen}")
