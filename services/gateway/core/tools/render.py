"""Tools, tool calls and tool results in a prompt.

Messages are Hugging Face chat-template dicts (``{"role", "content", "tool_calls": [{"id", "type": "function",
"function": {"name", "arguments": dict}}], "tool_call_id", "name"}``); tools are OpenAI chat function tool specs.
An agent whose chat template renders tools itself (it reads the ``tools`` variable, as Qwen's, Hermes' and
Llama 3.1's do) gets them through ``apply_chat_template(tools=...)``; any other template gets
:func:`fallback_messages`: plain messages in the agent's tool parser's format (docs/gateway.md, "Tools").
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from services.gateway.core.tools.parsers import ToolParser


@functools.lru_cache(maxsize=64)
def template_supports_tools(template: str | None) -> bool:
    """Whether a jinja chat template renders tools itself: it reads the ``tools`` variable.

    A template that cannot be parsed is treated as without support (rendering it fails later with its own error).
    """
    if not template:
        return False
    import jinja2
    import jinja2.meta

    try:
        ast = jinja2.Environment().parse(template)
    except jinja2.TemplateSyntaxError:
        return False
    return "tools" in jinja2.meta.find_undeclared_variables(ast)


def has_tool_turns(messages: Sequence[dict[str, Any]]) -> bool:
    """Whether ``messages`` hold a tool call (an assistant's ``tool_calls``) or a tool result."""
    return any(m.get("tool_calls") or m.get("role") == "tool" for m in messages)


def unmatched_tool_result(messages: Sequence[dict[str, Any]]) -> int | None:
    """The index of the first ``tool`` message whose ``tool_call_id`` names no call of an earlier assistant
    message; None when every result answers a call."""
    called: set[str] = set()
    for i, m in enumerate(messages):
        for c in m.get("tool_calls") or ():
            called.add(c["id"])
        if m.get("role") == "tool" and m.get("tool_call_id") not in called:
            return i
    return None


def fallback_messages(
    messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None, parser: ToolParser
) -> list[dict[str, Any]]:
    """``messages`` as plain ``{"role", "content"}`` messages a template without tool support renders.

    - ``tools``: the parser's :meth:`~ToolParser.tools_block` ends the first system message (or is the system
      message, put first, when there is none);
    - an assistant message's ``tool_calls``: written by :meth:`~ToolParser.render_calls` on a line after its
      content;
    - consecutive ``tool`` messages: one ``user`` message of their contents written by
      :meth:`~ToolParser.render_results`.
    """
    out: list[dict[str, Any]] = []
    results: list[str] = []
    for m in messages:
        if m["role"] == "tool":
            results.append(m.get("content") or "")
            continue
        if results:
            out.append({"role": "user", "content": parser.render_results(results)})
            results = []
        text = m.get("content") or ""
        calls = [(c["function"]["name"], c["function"]["arguments"]) for c in m.get("tool_calls") or ()]
        written = [parser.render_calls(calls)] if calls else []
        out.append({"role": m["role"], "content": "\n".join(([text] if text else []) + written)})
    if results:
        out.append({"role": "user", "content": parser.render_results(results)})
    if tools:
        block = parser.tools_block(tools)
        if out and out[0]["role"] == "system":
            out[0] = {
                "role": "system",
                "content": f"{out[0]['content']}\n\n{block}" if out[0]["content"] else block,
            }
        else:
            out.insert(0, {"role": "system", "content": block})
    return out
