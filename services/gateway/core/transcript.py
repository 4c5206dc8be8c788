"""The exact token ids of the replies the gateway generated, kept per open episode, so that a conversation which
carries a reply back in its next request is never re-tokenised ("token in, token out").

A chat client sends the whole conversation on every call, the model's earlier replies included as assistant
messages. Rendering those messages through the chat template and tokenising the text again gives ids that can
differ from the ones the model sampled (a word the model spelled with two tokens comes back as one, a tool
call's JSON is re-serialised); the next call's prompt would then not extend the previous call's prompt and
response, the trace would split into separate samples, and the learner would train on ids the policy never
produced. So every traced reply is remembered under what produced it: the messages and tools of its request
(``prefix``) and the assistant message the client got back (``reply``, as the client will send it again). A
later request of the same episode and agent whose messages ``[0, k)`` and tools are that prefix and whose
message ``k`` is that reply starts from the remembered ids; only what follows message ``k`` is rendered and
tokenised (:meth:`~services.gateway.core.gateway.Gateway.chat_ids`).

Keys compare what a chat template reads: role, content (``None`` and ``""`` alike), tool calls by name and
arguments (JSON compared as parsed, so whitespace and key order do not matter; the call ids are not compared,
since clients may rename them), ``tool_call_id`` and ``name``.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


def _arguments(value: Any) -> Any:
    """A tool call's arguments as parsed JSON (a string that is not JSON stays the string)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def message_key(message: Mapping[str, Any]) -> str:
    """Canonical JSON of what a chat template reads from one message (see the module docstring)."""
    calls = [
        [
            (c.get("function") or {}).get("name", c.get("name")),
            _arguments((c.get("function") or {}).get("arguments", c.get("arguments"))),
        ]
        for c in message.get("tool_calls") or ()
    ]
    canonical = {
        "role": message.get("role"),
        "content": message.get("content") or "",
        "tool_calls": calls,
        "tool_call_id": message.get("tool_call_id") or "",
        "name": message.get("name") or "",
    }
    return json.dumps(canonical, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def _tools_key(tools: Sequence[Mapping[str, Any]] | None) -> str:
    return json.dumps(
        list(tools or ()), sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str
    )


@dataclass(frozen=True)
class Spoken:
    """One generated reply as a later prompt may carry it back.

    Attributes:
        ids: The prompt's token ids followed by the reply's, exactly as sampled (``P + R`` ids); the last is the
            token that ended the reply (an end-of-turn token, or not when ``max_tokens`` or a stop string cut it:
            the backend then declines to splice, :meth:`InferenceBackend.chat_tail`).
    """

    ids: tuple[int, ...]


class Transcripts:
    """Remembered replies per open episode and agent, at most ``max_per_episode`` per episode (oldest forgotten
    first). Thread-safe (the gateway renders prompts in worker threads).

    Args:
        max_per_episode: Most replies remembered per episode, > 0 (the gateway passes
            ``gateway.max_calls_per_episode`` times its agents: every recorded choice can be carried back).
    """

    def __init__(self, max_per_episode: int) -> None:
        self.max_per_episode = max_per_episode
        self._lock = threading.Lock()
        self._episodes: dict[str, OrderedDict[tuple[str, str, str], Spoken]] = {}

    def __contains__(self, episode_id: object) -> bool:
        return episode_id in self._episodes

    @staticmethod
    def _prefix_keys(messages: Sequence[Mapping[str, Any]], tools: Any) -> list[str]:
        """``keys[k]``: the key of ``messages[:k]`` with ``tools`` (k = 0 .. len(messages))."""
        h = hashlib.sha256(_tools_key(tools).encode())
        keys = [h.hexdigest()]
        for m in messages:
            h.update(b"\x00" + message_key(m).encode())
            keys.append(h.copy().hexdigest())
        return keys

    def remember(
        self,
        episode_id: str,
        agent: str,
        messages: Sequence[Mapping[str, Any]],
        tools: Any,
        reply: Mapping[str, Any],
        spoken: Spoken,
    ) -> None:
        """Remember that ``agent``, prompted with ``messages`` and ``tools`` in ``episode_id``, replied ``reply``
        (the assistant message the client received) with the exact ids of ``spoken``."""
        key = (agent, self._prefix_keys(messages, tools)[-1], message_key(reply))
        with self._lock:
            entries = self._episodes.setdefault(episode_id, OrderedDict())
            entries[key] = spoken
            entries.move_to_end(key)
            while len(entries) > self.max_per_episode:
                entries.popitem(last=False)

    def lookup(
        self, episode_id: str, agent: str, messages: Sequence[Mapping[str, Any]], tools: Any
    ) -> tuple[int, Spoken] | None:
        """The latest assistant message of ``messages`` that is a remembered reply of ``agent`` to exactly the
        messages before it (and ``tools``): ``(k, spoken)`` with ``messages[k]`` that reply; None when none is."""
        if episode_id not in self._episodes:
            return None
        prefix = self._prefix_keys(messages, tools)
        with self._lock:
            entries = self._episodes.get(episode_id) or {}
            for k in range(len(messages) - 1, -1, -1):
                if messages[k].get("role") != "assistant":
                    continue
                hit = entries.get((agent, prefix[k], message_key(messages[k])))
                if hit is not None:
                    return k, hit
        return None

    def forget(self, episode_id: str) -> None:
        """Drop everything remembered for ``episode_id`` (it was reported, abandoned or closed)."""
        with self._lock:
            self._episodes.pop(episode_id, None)

    def __len__(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._episodes.values())
