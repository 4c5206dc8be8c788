"""Chat prompts of the gateway: tools rendered through the agent's chat template or the parser's fallback
format, and a reply the gateway generated never re-tokenised (:mod:`services.gateway.core.transcript`).

A traced prompt whose messages carry back a reply of the same agent in the same episode (to exactly the
messages and tools that produced it) is that reply's prompt and response ids, exactly as sampled, followed by
the template's rendering of what came after it (:meth:`InferenceBackend.chat_tail`: from the reply's
end-of-turn token to the next generation prompt). The trace then sees the new prompt extend the previous call's
prompt and response, so the multi-turn conversation stays one sample whose tool results and other messages
have mask 0 (:mod:`services.gateway.core.traces`). When the tail cannot be cut exactly (the reply was cut by
``max_tokens`` or a stop string, the template rewrites earlier turns, a later message holds special-token text)
the whole prompt is rendered and tokenised, and counted in ``prompts_retokenized``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from marti.types.inference import ChatMessages, Generation
from marti.types.tools import ChatReply
from services.gateway.core.backend import InferenceBackend
from services.gateway.core.tools import ToolParser, fallback_messages, has_tool_turns
from services.gateway.core.traces import EpisodeTracker
from services.gateway.core.transcript import Spoken, Transcripts

Tools = Sequence[dict[str, Any]] | None
#: A conversation rendered with and without a ``name`` on each message: a template whose two prompts are the same
#: renders no names.
NAME_PROBE = (
    {"role": "system", "content": "s"},
    {"role": "user", "content": "u"},
    {"role": "assistant", "content": "a"},
    {"role": "user", "content": "v"},
)


def reply_message(reply: ChatReply) -> dict[str, Any]:
    """The assistant message a client sends back for ``reply`` (chat-template form)."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in reply.tool_calls
        ]
    return message


class ChatPrompts:
    """Renders chat prompts for the gateway and remembers the replies it generated.

    Args:
        backend: The policies' templates and tokenizers.
        parser_of: agent -> its tool-call parser (whose fallback format renders tools for a template without).
        tracker: The gateway's open episodes (a reply is remembered while its episode is open).
        max_per_episode: Most replies remembered per episode.
    """

    def __init__(
        self,
        backend: InferenceBackend,
        parser_of: Callable[[str], ToolParser],
        tracker: EpisodeTracker,
        max_per_episode: int,
    ) -> None:
        self.backend = backend
        self._parser_of = parser_of
        self._tracker = tracker
        self.transcripts = Transcripts(max_per_episode)
        self.spliced = 0
        self.retokenized = 0
        self._reads_names: dict[str, bool] = {}  # agent -> whether its template renders a message's name

    def reads_names(self, agent: str) -> bool:
        """Whether the agent's chat template renders a message's ``name`` (:data:`NAME_PROBE` rendered with and
        without names differs; a template that refuses the probe counts as one that does). Cached per agent."""
        known = self._reads_names.get(agent)
        if known is None:
            named = [{**m, "name": "probe"} for m in NAME_PROBE]
            try:
                known = self.backend.chat_prompt(agent, named) != self.backend.chat_prompt(
                    agent, list(NAME_PROBE)
                )
            except Exception:  # noqa: BLE001 - a template that cannot render the probe: keep every name
                known = True
            self._reads_names[agent] = known
        return known

    def unnamed(self, agent: str, messages: ChatMessages) -> ChatMessages:
        """``messages`` without the ``name`` of their non-``tool`` messages when the agent's template renders no
        names (the prompt is the same either way), so a reply the client carries back with a name (LangGraph
        names an agent's messages) still matches the remembered reply and keeps its exact ids; else as they are.
        """
        if not any("name" in m and m.get("role") != "tool" for m in messages) or self.reads_names(agent):
            return messages
        return [
            m if m.get("role") == "tool" else {k: v for k, v in m.items() if k != "name"} for m in messages
        ]

    def _shaped(self, agent: str, messages: ChatMessages, tools: Tools) -> tuple[list[dict[str, Any]], Tools]:
        """The messages and tools as the agent's template takes them (the fallback format when it reads none)."""
        msgs = [{**m, "content": m.get("content") or ""} for m in messages]
        if (tools or has_tool_turns(msgs)) and not self.backend.renders_tools(agent):
            return fallback_messages(msgs, tools, self._parser_of(agent)), None
        return msgs, (list(tools) if tools else None)

    def _template(self, agent: str, messages: ChatMessages, tools: Tools) -> list[int]:
        msgs, tools = self._shaped(agent, messages, tools)
        return (
            self.backend.chat_prompt(agent, msgs, tools) if tools else self.backend.chat_prompt(agent, msgs)
        )

    def render(self, agent: str, messages: ChatMessages, tools: Tools, episode_id: str = "") -> list[int]:
        """Token ids of a chat prompt with the generation prompt (blocking: run it in a worker thread).

        Raises:
            InvalidArgumentError: Malformed messages.
        """
        messages = self.unnamed(agent, messages)
        hit = self.transcripts.lookup(episode_id, agent, messages, tools) if episode_id else None
        if hit is None:
            return self._template(agent, messages, tools)
        k, spoken = hit
        upto, _ = self._shaped(agent, messages[: k + 1], tools)
        msgs, shaped_tools = self._shaped(agent, messages, tools)
        tail = None
        if msgs[: len(upto)] == upto:  # the shaping keeps the carried-back reply's place
            tail = self.backend.chat_tail(agent, msgs, len(upto) - 1, spoken.ids[-1], shaped_tools)
        if tail is None:
            self.retokenized += 1
            return self._template(agent, messages, tools)
        self.spliced += 1
        return [*spoken.ids, *tail]

    def remember(
        self,
        episode_id: str,
        agent: str,
        messages: ChatMessages,
        tools: Tools,
        replies: Sequence[ChatReply],
        generations: Sequence[Generation],
    ) -> None:
        """Remember each reply of a traced call with its exact ids, while ``episode_id`` is open (forgotten when
        it closes)."""
        if not episode_id:
            return
        if episode_id not in self.transcripts:
            transcripts = self.transcripts
            if not self._tracker.on_close(episode_id, lambda: transcripts.forget(episode_id)):
                return  # reported or abandoned meanwhile: nothing will carry it back
        messages = self.unnamed(agent, messages)
        for reply, g in zip(replies, generations, strict=True):
            ids = (*g.prompt_token_ids, *g.response_token_ids)
            self.transcripts.remember(episode_id, agent, messages, tools, reply_message(reply), Spoken(ids))
