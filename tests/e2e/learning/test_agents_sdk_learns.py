"""End to end: `examples/agents_sdk/run.sh` trains an OpenAI Agents SDK team, unchanged, through the gateway.

The app (`agents.Agent`, `Runner.run`, a `function_tool`, a handoff, tracing off) reaches the gateway over the
Responses API with one model name per agent, so the router and the calculator are two LoRA policies on
SmolLM2-135M-Instruct. The app plays and rewards its training episodes over HTTP (1 for an agent's right call:
the router's handoff, the calculator's `add` of the question's numbers) and measures each agent's valid-call rate
on held-out questions before training and after the last update. The rate must rise for **each** agent; with
`--set learning_rate=1e-12` (nothing learned) it does not (docs/gateway.md, "Agent frameworks", has both runs).
"""

from __future__ import annotations

import sys

import pytest

from tests.e2e.learning.example_runs import FRAMEWORK_LEARNING, ROOT, check_learns, imported_modules

EXAMPLE = ROOT / "examples" / "agents_sdk"
pytestmark = pytest.mark.slow
#: Each agent's held-out valid-call rate must rise at least this much over the untrained policy's.
MARGIN = 0.2


def test_the_agent_code_imports_no_marti_module():
    app = imported_modules(EXAMPLE / "app.py")
    shared = imported_modules(ROOT / "examples" / "tool_team" / "tool_team.py")
    assert {"agents", "openai", "tool_team"} <= app, app
    allowed = set(sys.stdlib_module_names) | {"__future__", "agents", "openai", "tool_team"}
    assert app | shared <= allowed, (app | shared) - allowed


@FRAMEWORK_LEARNING
@pytest.mark.timeout(660)
def test_run_sh_trains_each_agent_and_its_valid_calls_rise(tmp_path):
    check_learns(
        EXAMPLE / "run.sh", tmp_path / "run", final="trained 3 steps on 72 external episodes", margin=MARGIN,
        timeout_s=600,
    )  # fmt: skip
