"""Tool-call parsers: read the tool calls out of a model's reply text (vLLM's ``--tool-call-parser``).

One parser per chat-template family, chosen per agent (``gateway.tool_parser``, ``gateway.tool_parsers``). A parser
also says how its family writes calls and results, which the gateway uses where the agent's chat template cannot
render tools itself (:mod:`services.gateway.core.tools.render`), and what a reply forced to be a call starts with
(``tool_choice`` ``required`` or a named function: the prompt is prefilled with it).
"""

from __future__ import annotations

import abc
import hashlib
import json
import re
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from marti.errors import InvalidArgumentError
from marti.types.tools import ToolCall
from services.gateway.core.json_text import loads_finite


@dataclass(frozen=True)
class Parsed:
    """What a parser read from a reply's text.

    Attributes:
        content: The text outside the calls (None when there is none but whitespace); the whole text when
            ``unparsed``.
        calls: The calls, in order (empty when there were none, or when ``unparsed``).
        unparsed: The text tried to make a call that could not be parsed (malformed JSON, an unknown tool name,
            arguments that are not an object): it is returned whole as ``content``.
    """

    content: str | None
    calls: tuple[ToolCall, ...]
    unparsed: bool = False


def new_call_id() -> str:
    """A fresh tool call id: ``call_`` and 24 hex digits."""
    return "call_" + uuid.uuid4().hex[:24]


def derived_call_id(call_id: str, index: int) -> str:
    """The id of tool call ``index`` of the generation ``call_id``: ``call_`` and 24 hex digits of their hash, so
    the same generation's calls always get the same ids."""
    return "call_" + hashlib.sha256(f"{call_id}/{index}".encode()).hexdigest()[:24]


def compact_json(value: Any) -> str:
    """``value`` as compact JSON text (no spaces after separators; non-ASCII characters kept)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class ToolParser(abc.ABC):
    """One template family's tool-call format: parsing replies, and writing calls, results and the tool list."""

    #: The name the config selects it by (one of :data:`marti.types.tools.TOOL_PARSER_NAMES`).
    name: str
    #: Text that ends one call: with ``parallel_tool_calls: false`` generation stops at it (one call at most).
    #: None for formats without one: a reply with more than one call is then returned as text (unparsed).
    call_end: str | None

    @abc.abstractmethod
    def parse(self, text: str, tool_names: Collection[str]) -> Parsed:
        """The calls in ``text`` (a reply, with any forced prefix in front) of the tools named ``tool_names``."""

    @abc.abstractmethod
    def forced_prefix(self, name: str | None) -> str:
        """The start of a call, prefilled into the prompt so the reply is a call: of the function ``name``, or of
        any function (None: ``tool_choice: required``)."""

    @abc.abstractmethod
    def render_calls(self, calls: Sequence[tuple[str, dict[str, Any]]]) -> str:
        """One message's calls (``(name, arguments)`` pairs) as the model writes them (history rendered without
        template support for tools)."""

    @abc.abstractmethod
    def render_results(self, results: Sequence[str]) -> str:
        """Consecutive tool results as the text of one user turn (history rendered without template support)."""

    @abc.abstractmethod
    def tools_block(self, tools: Sequence[dict[str, Any]]) -> str:
        """The system-prompt block that lists ``tools`` (OpenAI function tool specs) and says how to call them."""


#: The system block of :class:`HermesParser` (Qwen 2.5's wording); ``{tools}`` is one JSON line per tool.
_HERMES_BLOCK = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


class HermesParser(ToolParser):
    """Hermes-style calls (Hermes 2/3, Qwen 2.5/3): each call is ``<tool_call>{"name": NAME, "arguments": {...}}
    </tool_call>``; several in one reply are parallel calls; text outside them is the reply's content. The last
    call may lack its ``</tool_call>`` (generation stopped at it). Results are ``<tool_response>...
    </tool_response>`` blocks in a user turn."""

    name = "hermes"
    call_start = "<tool_call>"
    call_end = "</tool_call>"
    _CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)\Z", re.DOTALL)

    def parse(self, text: str, tool_names: Collection[str]) -> Parsed:
        """See :meth:`ToolParser.parse`; any call that does not parse makes the whole reply ``unparsed``."""
        if self.call_start not in text:
            return Parsed(text, ())
        calls = []
        outside = []
        at = 0
        for m in self._CALL.finditer(text):
            outside.append(text[at : m.start()])
            at = m.end()
            call = _hermes_call(m.group(1) if m.group(1) is not None else m.group(2), tool_names)
            if call is None:
                return Parsed(text, (), unparsed=True)
            calls.append(call)
        outside.append(text[at:])
        content = "".join(outside).strip()
        return Parsed(content or None, tuple(calls))

    def forced_prefix(self, name: str | None) -> str:
        """``<tool_call>\\n``, then ``{"name": NAME, "arguments": `` when the function is named."""
        head = self.call_start + "\n"
        return head if name is None else head + _named(name)

    def render_calls(self, calls: Sequence[tuple[str, dict[str, Any]]]) -> str:
        """Each call as ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, one per line."""
        return "\n".join(f"{self.call_start}\n{_call_json(n, a)}\n{self.call_end}" for n, a in calls)

    def render_results(self, results: Sequence[str]) -> str:
        """Each result in ``<tool_response>\\n...\\n</tool_response>``, one per line."""
        return "\n".join(f"<tool_response>\n{r}\n</tool_response>" for r in results)

    def tools_block(self, tools: Sequence[dict[str, Any]]) -> str:
        """The tools as JSON lines inside ``<tools>``, and the ``<tool_call>`` format."""
        return _HERMES_BLOCK.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))


class MistralParser(ToolParser):
    """Mistral-style calls (Mistral 7B v0.3, Mixtral, Mistral Nemo): ``[TOOL_CALLS]`` then a JSON array of
    ``{"name": NAME, "arguments": {...}}`` objects (several: parallel calls); text before it is the reply's
    content. Results are ``[TOOL_RESULTS]{"content": ...}[/TOOL_RESULTS]`` blocks; the tools are listed in
    ``[AVAILABLE_TOOLS]...[/AVAILABLE_TOOLS]``. The format has no end of one call (``call_end`` None)."""

    name = "mistral"
    call_start = "[TOOL_CALLS]"
    call_end = None

    def parse(self, text: str, tool_names: Collection[str]) -> Parsed:
        """See :meth:`ToolParser.parse`: the array after ``[TOOL_CALLS]`` (one object alone is one call)."""
        if self.call_start not in text:
            return Parsed(text, ())
        head, _, body = text.partition(self.call_start)
        try:
            items = loads_finite(body.strip())
        except ValueError:
            return Parsed(text, (), unparsed=True)
        calls = [_checked_call(item, tool_names) for item in (items if isinstance(items, list) else [items])]
        if not calls or any(c is None for c in calls):
            return Parsed(text, (), unparsed=True)
        return Parsed(head.strip() or None, tuple(c for c in calls if c is not None))

    def forced_prefix(self, name: str | None) -> str:
        """``[TOOL_CALLS][``, then ``{"name": NAME, "arguments": `` when the function is named."""
        head = self.call_start + "["
        return head if name is None else head + _named(name)

    def render_calls(self, calls: Sequence[tuple[str, dict[str, Any]]]) -> str:
        """``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``."""
        return self.call_start + "[" + ", ".join(_call_json(n, a) for n, a in calls) + "]"

    def render_results(self, results: Sequence[str]) -> str:
        """Each result as ``[TOOL_RESULTS]{"content": ...}[/TOOL_RESULTS]``."""
        return "".join(
            f"[TOOL_RESULTS]{json.dumps({'content': r}, ensure_ascii=False)}[/TOOL_RESULTS]" for r in results
        )

    def tools_block(self, tools: Sequence[dict[str, Any]]) -> str:
        """``[AVAILABLE_TOOLS]`` + the tools as a JSON array + ``[/AVAILABLE_TOOLS]``."""
        return f"[AVAILABLE_TOOLS]{json.dumps(list(tools), ensure_ascii=False)}[/AVAILABLE_TOOLS]"


def _named(name: str) -> str:
    """The start of a call object of the function ``name``, up to its arguments: ``{"name": NAME, "arguments": ``."""
    return '{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": '


def _call_json(name: str, arguments: dict[str, Any]) -> str:
    """``{"name": ..., "arguments": {...}}`` as JSON text."""
    return json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)


def _hermes_call(body: str, tool_names: Collection[str]) -> ToolCall | None:
    """One Hermes call body as a call (see :func:`_checked_call`), or None when it is not JSON."""
    try:
        obj = loads_finite(body.strip())
    except ValueError:
        return None
    return _checked_call(obj, tool_names)


def _checked_call(obj: Any, tool_names: Collection[str]) -> ToolCall | None:
    """A decoded call object as a :class:`ToolCall`, or None when it is not an object naming a known tool with
    object arguments (or arguments given as JSON text of an object, or none: ``{}``)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or obj["name"] not in tool_names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = loads_finite(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(new_call_id(), obj["name"], compact_json(args))


#: Parser name -> class; the names are :data:`marti.types.tools.TOOL_PARSER_NAMES` (the config checks against those).
TOOL_PARSERS: dict[str, type[ToolParser]] = {"hermes": HermesParser, "mistral": MistralParser}


def tool_parser(name: str) -> ToolParser:
    """The parser called ``name``.

    Raises:
        InvalidArgumentError: An unknown name (the known ones are named).
    """
    cls = TOOL_PARSERS.get(name)
    if cls is None:
        raise InvalidArgumentError(f"unknown tool parser {name!r}; known parsers: {sorted(TOOL_PARSERS)}")
    return cls()
