"""A two-agent LangGraph app (``langgraph`` + ``langchain-openai``): no marti import anywhere in this file.

A ``StateGraph`` over the conversation's messages with two agent nodes, each a ``ChatOpenAI(base_url=...,
model=<agent>)`` bound to its own tool with ``bind_tools(..., tool_choice="required")``: the ``router`` calls
``transfer_to_calculator`` (a supervisor-style handoff tool), a ``ToolNode`` runs it, and the ``calculator`` calls
``add(a, b)`` with the two numbers of the question, which a second ``ToolNode`` runs. Each agent is its own model
name on the gateway (``model="router"``, ``model="calculator"``, over ``/v1/chat/completions``), so each is trained
as its own policy. When the router makes no call, the graph goes to the calculator anyway, so every episode has a
call of each agent. The task, the rewards (1 for an agent's right call) and the training loop are in
``examples/tool_team/tool_team.py``, shared with the OpenAI Agents SDK example.

Each agent node sends its own instructions, its worked example (the few-shot help a small model needs) and the
episode's question; the graph's state holds the episode's messages (the question, the calls and their results).

The only training-specific part is the ``base_url`` of the ``ChatOpenAI`` models (one per episode, which the
gateway records the calls under) and the reward report that ``tool_team`` POSTs when the episode ends.

Usage::

    python app.py --gateway http://127.0.0.1:8000/v1 --rounds 3 --episodes-per-round 24   # training episodes
    python app.py --gateway http://127.0.0.1:8000/v1 --evaluate                      # held-out questions
"""

from __future__ import annotations

import sys
from pathlib import Path

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tool_team"))
import tool_team  # noqa: E402  (the shared task, next to this folder)


@tool
def transfer_to_calculator() -> str:
    """Hand the question to the calculator agent."""
    return tool_team.EXAMPLE_RESULTS["router"]


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


TOOLS = {"router": transfer_to_calculator, "calculator": add}


def preamble(agent: str) -> list[AnyMessage]:
    """``agent``'s instructions and worked example: question, its call, the result, the team's answer."""
    name, args = tool_team.EXAMPLE_CALLS[agent]
    call_id = f"call_example_{agent}"
    return [
        SystemMessage(tool_team.INSTRUCTIONS[agent]),
        HumanMessage(tool_team.EXAMPLE_QUESTION),
        AIMessage("", tool_calls=[{"name": name, "args": args, "id": call_id, "type": "tool_call"}]),
        ToolMessage(tool_team.EXAMPLE_RESULTS[agent], tool_call_id=call_id),
        AIMessage(tool_team.EXAMPLE_ANSWER),
    ]


def agent_node(agent: str, base_url: str, api_key: str, temperature: float, max_tokens: int):  # noqa: ANN201
    """The graph node of ``agent``: its own model on the gateway, bound to its own tool (one call, required)."""
    llm = ChatOpenAI(
        model=agent, base_url=base_url, api_key=api_key, temperature=temperature, max_tokens=max_tokens
    ).bind_tools([TOOLS[agent]], tool_choice="required", parallel_tool_calls=False)

    async def node(state: MessagesState) -> dict:
        reply = await llm.ainvoke([*preamble(agent), state["messages"][0]])  # the episode's question
        reply.name = agent  # which agent spoke (the episode's calls are read back by it)
        return {"messages": [reply]}

    return node


def after_router(state: MessagesState) -> str:
    """To the handoff tool when the router called it, else straight to the calculator."""
    return "handoff" if state["messages"][-1].tool_calls else "calculator"


def after_calculator(state: MessagesState) -> str:
    """To the add tool when the calculator called it, else the end."""
    return "add" if state["messages"][-1].tool_calls else END


def build_graph(base_url: str, api_key: str, temperature: float, max_tokens: int):  # noqa: ANN201
    """router -> (handoff tool) -> calculator -> (add tool) -> end, compiled."""
    graph = StateGraph(MessagesState)
    for agent in tool_team.AGENTS:
        graph.add_node(agent, agent_node(agent, base_url, api_key, temperature, max_tokens))
    graph.add_node("handoff", ToolNode([transfer_to_calculator], handle_tool_errors=True))
    graph.add_node("add", ToolNode([add], handle_tool_errors=True))
    graph.add_edge(START, "router")
    graph.add_conditional_edges("router", after_router, ["handoff", "calculator"])
    graph.add_edge("handoff", "calculator")
    graph.add_conditional_edges("calculator", after_calculator, ["add", END])
    graph.add_edge("add", END)
    return graph.compile()


async def play(
    base_url: str, api_key: str, pair: tuple[int, int], question: str, temperature: float, max_tokens: int
) -> tool_team.Calls:
    """One episode through the graph; returns each agent's calls (name, arguments) read from its messages."""
    state = await build_graph(base_url, api_key, temperature, max_tokens).ainvoke(
        {"messages": [HumanMessage(question)]}
    )
    calls: tool_team.Calls = {a: [] for a in tool_team.AGENTS}
    for message in state["messages"]:
        if isinstance(message, AIMessage) and message.name in calls:
            calls[message.name] += [(c["name"], c["args"]) for c in message.tool_calls]
            calls[message.name] += [(c["name"], None) for c in message.invalid_tool_calls]
    return calls


if __name__ == "__main__":
    sys.exit(tool_team.main(play, __doc__.splitlines()[0]))
