"""End to end: `examples/langgraph/run.sh` trains a LangGraph team, unchanged, through the gateway.

The app (a `StateGraph` with two agent nodes, each a `langchain_openai.ChatOpenAI(base_url=..., model=<agent>)`
with `bind_tools`, and `ToolNode`s running the calls) reaches the gateway over `/v1/chat/completions` with tools,
so the router and the calculator are two LoRA policies on SmolLM2-135M-Instruct. Rewards, held-out evaluation and
the margin are those of the OpenAI Agents SDK example (`examples/tool_team/tool_team.py`); with
`--set learning_rate=1e-12` the rates do not rise (docs/gateway.md, "Agent frameworks", has both runs).
"""

from __future__ import annotations

import sys

import pytest

from tests.e2e.learning.example_runs import FRAMEWORK_LEARNING, ROOT, check_learns, imported_modules
from tests.e2e.learning.test_agents_sdk_learns import MARGIN

EXAMPLE = ROOT / "examples" / "langgraph"
pytestmark = pytest.mark.slow
FRAMEWORK = {"langchain_core", "langchain_openai", "langgraph", "tool_team"}


def test_the_agent_code_imports_no_marti_module():
    app = imported_modules(EXAMPLE / "app.py")
    assert FRAMEWORK <= app, app
    assert app <= set(sys.stdlib_module_names) | {"__future__"} | FRAMEWORK, app


@FRAMEWORK_LEARNING
@pytest.mark.timeout(660)
def test_run_sh_trains_each_agent_and_its_valid_calls_rise(tmp_path):
    check_learns(
        EXAMPLE / "run.sh", tmp_path / "run", final="trained 3 steps on 72 external episodes", margin=MARGIN,
        timeout_s=600,
    )  # fmt: skip
