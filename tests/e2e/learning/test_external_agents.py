"""End to end: `examples/external_agents/run.sh` trains a team written only against the `openai` package.

The example's agent code (`app.py`) imports no marti module. The job (`rollout.source: external`) serves alice's
and bob's LoRA policies on SmolLM2-135M-Instruct through the gateway; the app plays and rewards 3 rounds of 48
episodes over HTTP, one on-policy round per update (round k once version k serves), and evaluates held-out
questions greedily before training and after the last update (while the gateway lingers). Learning must show for
**each** agent, and the targets differ per agent (alice: answer "yes", bob: answer "no"), so serving one agent's
adapter for the other fails the test.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.e2e.learning.example_runs import ROOT, imported_modules, rates, run_example, step_metrics

EXAMPLE = ROOT / "examples" / "external_agents"
pytestmark = pytest.mark.slow
#: Each agent's held-out reward must rise at least this much over the untrained policy's.
MARGIN = 0.3
#: Runs (seeds 0, 1, ...) of which one must show the rise for both agents.
ATTEMPTS = 2
AGENTS = ("alice", "bob")


def test_the_agent_code_imports_only_openai_and_the_standard_library():
    names = imported_modules(EXAMPLE / "app.py")
    assert "openai" in names and not any(n.startswith(("marti", "services")) for n in names), names
    assert names - {"openai"} <= set(sys.stdlib_module_names) | {"__future__"}, names


def _train(run_dir: Path, seed: int) -> tuple[dict[str, float], dict[str, float]]:
    """Run ``run.sh`` with the job seeded ``seed``; check it ran whole and every update trained on-policy (each
    agent's items of each step were sampled by the current version: ``version_lag_max`` 0, nothing
    ``stale_dropped``); return the held-out rewards before and after."""
    lines = run_example(EXAMPLE / "run.sh", run_dir, "--set", f"seed={seed}", timeout_s=900)
    assert lines[-1] == "trained 3 steps on 144 external episodes", lines[-10:]
    assert any(x.startswith("gateway listening on http://") for x in lines), lines[:10]
    lags = [
        (m[f"{a}/version_lag_max"], m[f"{a}/stale_dropped"]) for m in step_metrics(run_dir) for a in AGENTS
    ]
    assert len(lags) == 3 * len(AGENTS) and all(lag == (0.0, 0.0) for lag in lags), lags
    return rates(lines, "untrained", AGENTS), rates(lines, "trained (held-out)", AGENTS)


@pytest.mark.timeout(ATTEMPTS * 900 + 60)  # each run has its own 900 s limit (the suite's default is 600 s)
def test_run_sh_trains_each_agent_on_external_episodes_and_learning_shows(tmp_path):
    """Learning must show for both agents in one of :data:`ATTEMPTS` runs with different seeds.

    Each agent's target word is rare when sampled at temperature 1 (about 2-10% of samples), so a GRPO group can
    hold no rewarded sample. With groups of 4 a run sometimes went several updates without one for an agent
    (about one run in three failed); the example now plays groups of 8 (README). It also plays on-policy rounds
    (checked in :func:`_train`): while the app kept playing during an update, updates 2 and 3 trained partly or
    wholly on rounds the weights one update older had played, and the first seeded run missed the rise in 2 of
    about 10 suite runs. A second seeded run keeps bad luck from failing the suite; every attempt must
    still run whole."""
    seen = []
    for seed in range(ATTEMPTS):
        before, after = _train(tmp_path / f"run-{seed}", seed)
        seen.append((seed, before, after))
        if all(after[a] >= before[a] + MARGIN for a in AGENTS):
            return
    pytest.fail(f"no attempt showed a rise of {MARGIN} for both agents: (seed, before, after) = {seen}")
