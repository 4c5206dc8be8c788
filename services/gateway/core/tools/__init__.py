"""Tool calling in the gateway core: the tool-call parsers (one per chat-template family, chosen per agent) and the
rendering of tools, tool calls and tool results into a prompt (docs/gateway.md, "Tools")."""

from services.gateway.core.tools.parsers import (
    TOOL_PARSERS,
    HermesParser,
    MistralParser,
    Parsed,
    ToolParser,
    tool_parser,
)
from services.gateway.core.tools.render import (
    fallback_messages,
    has_tool_turns,
    template_supports_tools,
    unmatched_tool_result,
)

__all__ = [
    "TOOL_PARSERS",
    "HermesParser",
    "MistralParser",
    "Parsed",
    "ToolParser",
    "fallback_messages",
    "has_tool_turns",
    "template_supports_tools",
    "tool_parser",
    "unmatched_tool_result",
]
