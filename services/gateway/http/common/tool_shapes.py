"""The shapes of a function tool and of a named ``tool_choice`` on the three chat routes, so that a tool written for
one API and sent to another is refused with an error that says which shape the route expects and shows it.

================  ==========================================================  =========================================
API (route)       a tool                                                      a named ``tool_choice``
================  ==========================================================  =========================================
chat              ``{"type": "function", "function": {"name", ...}}``         ``{"type": "function", "function": {"name"}}``
responses         ``{"type": "function", "name", "parameters", ...}``         ``{"type": "function", "name"}``
messages          ``{"name", "description", "input_schema"}``                 ``{"type": "tool", "name"}``
================  ==========================================================  =========================================
"""

from __future__ import annotations

from typing import Any

#: API key -> (its name, the route, its tool shape, its named tool_choice shape).
APIS = {
    "chat": (
        "the Chat Completions API",
        "/v1/chat/completions",
        '{"type": "function", "function": {"name": ..., "description": ..., "parameters": {...}}}',
        '{"type": "function", "function": {"name": ...}}',
    ),
    "responses": (
        "the Responses API",
        "/v1/responses",
        '{"type": "function", "name": ..., "description": ..., "parameters": {...}}',
        '{"type": "function", "name": ...}',
    ),
    "messages": (
        "Anthropic's Messages API",
        "/v1/messages",
        '{"name": ..., "description": ..., "input_schema": {...}}',
        '{"type": "tool", "name": ...}',
    ),
}


def tool_api(tool: Any) -> str | None:
    """The API whose tool shape ``tool`` has (a key of :data:`APIS`), or None when it has none of them."""
    if not isinstance(tool, dict):
        return None
    if tool.get("type") == "function" and isinstance(tool.get("function"), dict):
        return "chat"
    if tool.get("type") == "function" and "name" in tool:
        return "responses"
    if "input_schema" in tool and tool.get("type") in (None, "custom"):
        return "messages"
    return None


def choice_api(choice: Any) -> str | None:
    """The API whose named ``tool_choice`` shape ``choice`` has (a key of :data:`APIS`), or None."""
    if not isinstance(choice, dict):
        return None
    if choice.get("type") == "function":
        return (
            "chat" if isinstance(choice.get("function"), dict) else "responses" if "name" in choice else None
        )
    return "messages" if choice.get("type") == "tool" else None


def wrong_shape(value: Any, api: str, *, choice: bool = False) -> str | None:
    """The message for a tool (or a named ``tool_choice`` when ``choice``) sent to ``api`` (a key of
    :data:`APIS`) in another API's shape: the shape ``api`` expects, shown, and the API ``value`` looks written for;
    None when ``value`` has ``api``'s shape or no known one."""
    other = choice_api(value) if choice else tool_api(value)
    if other is None or other == api:
        return None
    name, route, tool_shape, choice_shape = APIS[api]
    what = "a named tool_choice" if choice else "a function tool"
    return (
        f"{route} ({name}) takes {what} as {choice_shape if choice else tool_shape}; this looks like "
        f"{APIS[other][0]}'s shape (for {APIS[other][1]})"
    )
