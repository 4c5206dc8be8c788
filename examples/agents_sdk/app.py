"""A two-agent OpenAI Agents SDK app (``openai-agents``): no marti import anywhere in this file.

The ``router`` agent hands every arithmetic question off to the ``calculator`` agent (an SDK handoff: the model
calls the tool ``transfer_to_calculator``); the calculator calls its function tool ``add(a, b)`` with the two
numbers of the question, and the tool's result is the answer (``tool_use_behavior="stop_on_first_tool"``). Each
agent is its own model name on the gateway (``OpenAIResponsesModel(model="router")``, ``model="calculator"``: the
Responses API, the SDK's default), so each is trained as its own policy. The task, the rewards (1 for an agent's
right call) and the training loop are in ``examples/tool_team/tool_team.py``, shared with the LangGraph example.

Each agent starts from a worked example of its own call: the router's input begins with it, and the handoff's
``input_filter`` (the SDK's way of shaping what the next agent sees) gives the calculator its own example and the
question, without the router's call. When the
router does not hand off (or its reply is cut at ``max_tokens``, which the SDK raises as ``ModelBehaviorError``),
the app gives the question to the calculator itself, so every episode has a call of each agent.

The only training-specific part is the ``base_url`` of the ``AsyncOpenAI`` client (one per episode, which the
gateway records the calls under) and the reward report that ``tool_team`` POSTs when the episode ends.

Usage::

    python app.py --gateway http://127.0.0.1:8000/v1 --rounds 3 --episodes-per-round 24   # training episodes
    python app.py --gateway http://127.0.0.1:8000/v1 --evaluate                      # held-out questions
    python app.py --gateway http://127.0.0.1:8000/v1 --evaluate --wait-version 3     # after 3 updates
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from agents import (
    Agent,
    ModelSettings,
    OpenAIResponsesModel,
    RunHooks,
    Runner,
    function_tool,
    handoff,
    set_tracing_disabled,
)
from agents.exceptions import ModelBehaviorError
from agents.handoffs import HandoffInputData
from openai import AsyncOpenAI

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tool_team"))
import tool_team  # noqa: E402  (the shared task, next to this folder)


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def example(agent: str) -> list[dict]:
    """``agent``'s worked example as Responses API input items: question, its call, the result, the answer."""
    name, args = tool_team.EXAMPLE_CALLS[agent]
    call_id = f"call_example_{agent}"
    return [
        {"role": "user", "content": tool_team.EXAMPLE_QUESTION},
        {"type": "function_call", "call_id": call_id, "name": name, "arguments": json.dumps(args)},
        {"type": "function_call_output", "call_id": call_id, "output": tool_team.EXAMPLE_RESULTS[agent]},
        {"role": "assistant", "content": tool_team.EXAMPLE_ANSWER},
    ]


def calculator_input(data: HandoffInputData) -> HandoffInputData:
    """The handoff's input filter: the calculator sees its own worked example and the question (the last item of
    the router's input), as when the app gives it the question itself; not the router's example or handoff call
    (``new_items`` keeps them for the run's history)."""
    question = data.input_history[-1] if isinstance(data.input_history, tuple) else data.input_history
    return data.clone(input_history=(*example("calculator"), question), pre_handoff_items=(), input_items=())


def build_team(client: AsyncOpenAI, temperature: float, max_tokens: int) -> tuple[Agent, Agent]:
    """The router and the calculator, each served as its own model (its own policy) through ``client``."""
    settings = ModelSettings(
        tool_choice="required", parallel_tool_calls=False, temperature=temperature, max_tokens=max_tokens
    )
    calculator = Agent(
        name="calculator",
        instructions=tool_team.INSTRUCTIONS["calculator"],
        tools=[add],
        tool_use_behavior="stop_on_first_tool",
        model=OpenAIResponsesModel(model="calculator", openai_client=client),
        model_settings=settings,
    )
    router = Agent(
        name="router",
        instructions=tool_team.INSTRUCTIONS["router"],
        handoffs=[handoff(calculator, input_filter=calculator_input)],
        model=OpenAIResponsesModel(model="router", openai_client=client),
        model_settings=settings,
    )
    return router, calculator


class CallLog(RunHooks):
    """Run hooks that keep each agent's function calls (name, parsed arguments) as its model returned them."""

    def __init__(self) -> None:
        self.calls: tool_team.Calls = {a: [] for a in tool_team.AGENTS}
        self.asked: set[str] = set()

    async def on_llm_start(self, context, agent, system_prompt, input_items) -> None:  # noqa: ANN001
        """Note that ``agent`` was asked."""
        self.asked.add(agent.name)

    async def on_llm_end(self, context, agent, response) -> None:  # noqa: ANN001
        """Keep the function calls of ``agent``'s reply."""
        for out in response.output:
            if getattr(out, "type", None) == "function_call":
                self.calls[agent.name].append((out.name, tool_team.arguments(out.arguments)))


async def play(
    base_url: str, api_key: str, pair: tuple[int, int], question: str, temperature: float, max_tokens: int
) -> tool_team.Calls:
    """One episode: the router, then the calculator (through the handoff, or given the question by the app)."""
    router, calculator = build_team(AsyncOpenAI(base_url=base_url, api_key=api_key), temperature, max_tokens)
    log = CallLog()
    asked = {"role": "user", "content": question}
    try:
        await Runner.run(router, [*example("router"), asked], max_turns=4, hooks=log)
    except ModelBehaviorError:  # a reply cut at max_tokens: no valid call
        pass
    if "calculator" not in log.asked:  # no handoff: the app gives the question to the calculator itself
        try:
            await Runner.run(calculator, [*example("calculator"), asked], max_turns=2, hooks=log)
        except ModelBehaviorError:
            pass
    return log.calls


if __name__ == "__main__":
    set_tracing_disabled(True)  # the SDK's tracing would upload to OpenAI
    sys.exit(tool_team.main(play, __doc__.splitlines()[0]))
