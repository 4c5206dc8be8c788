"""Tool calling types shared by the inference gateway's protocol adapters and the SDK (docs/gateway.md, "Tools").

A model's reply to a request with tools is a :class:`ChatReply`: the text outside its tool calls and the
:class:`ToolCall` s it made, parsed by the agent's tool parser (:data:`TOOL_PARSER_NAMES`; ``gateway.tool_parser``
and ``gateway.tool_parsers``). Every protocol (OpenAI chat, Responses, Anthropic messages) builds its answer from it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_TOOL_PARSER", "TOOL_PARSER_NAMES", "ChatReply", "ToolCall"]

#: The tool-call parsers the gateway knows, one per chat-template family (vLLM's ``--tool-call-parser``):
#: ``hermes`` reads ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Hermes, Qwen 2.5 / 3 and others),
#: ``mistral`` reads ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` (Mistral v0.3, Mixtral, Nemo).
TOOL_PARSER_NAMES = ("hermes", "mistral")
#: The parser an agent uses when the config names none (``gateway.tool_parser``'s default).
DEFAULT_TOOL_PARSER = "hermes"


@dataclass(frozen=True)
class ToolCall:
    """One function call a model made.

    Attributes:
        id: ``call_<24 hex digits>``, made by the gateway; a client sends it back as the ``tool_call_id`` of the
            call's result.
        name: The function's name (one of the request's tools).
        arguments: The call's arguments: JSON text of an object (compact: no spaces after separators).
    """

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ChatReply:
    """One choice's assistant message, whatever the protocol.

    Attributes:
        content: The text outside the tool calls; None when the reply is only tool calls (``""`` is never used
            to mean "no text").
        tool_calls: The calls, in the order the model made them (empty: a plain text reply).
        finish_reason: ``"tool_calls"`` when there are calls, else the generation's (``"stop"`` or ``"length"``).
        unparsed: True when the model tried to call a tool and the call could not be parsed (malformed JSON, a
            tool the request does not define, arguments that are not an object): the whole reply is then returned
            as ``content`` and counted in the gateway's ``tool_calls_unparsed``.
    """

    content: str | None
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str
    unparsed: bool = False
