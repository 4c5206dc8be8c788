"""The stored responses a Responses API request may continue with ``previous_response_id`` (docs/gateway.md,
"Responses API").

A response is stored with its episode (``""`` for an untraced call) as its scope: the chat-template messages of
its request's input (``instructions`` excluded, as OpenAI does) and of its output, and the response it continued.
Each scope keeps at most ``gateway.max_stored_responses`` responses, the oldest forgotten first; an episode's are
all freed when it closes (reported, abandoned or closed unused: the tracker's ``on_close``), so nothing outlives
the episode. A continued conversation is the chain of its responses (a forgotten response stays readable through
the responses that continue it). A request may only continue a response of its own scope.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from marti.errors import NotFoundError
from marti.types.inference import ChatMessages
from services.gateway.http.common.errors import request_error

#: What a response id starts with (OpenAI's ``resp_``).
RESPONSE_ID_PREFIX = "resp_"
#: Registers a callback run when an open episode closes; False when the episode is not open (the tracker's
#: ``on_close``).
OnClose = Callable[[str, Callable[[], object]], bool]


def new_response_id() -> str:
    """A fresh response id: ``resp_`` and 32 hex digits."""
    return RESPONSE_ID_PREFIX + uuid.uuid4().hex


@dataclass(frozen=True)
class StoredResponse:
    """One stored response.

    Attributes:
        id: Its ``resp_...`` id.
        episode_id: Its scope: the episode of its call, ``""`` when untraced.
        messages: The chat-template messages of its input (without ``instructions``) and its output.
        previous: The stored response it continued, or None.
    """

    id: str
    episode_id: str
    messages: tuple[dict, ...]
    previous: StoredResponse | None = None

    def conversation(self) -> ChatMessages:
        """Every message of the chain that ends with this response, oldest first."""
        chain: list[StoredResponse] = []
        node: StoredResponse | None = self
        while node is not None:
            chain.append(node)
            node = node.previous
        return [m for r in reversed(chain) for m in r.messages]


class ResponseStore:
    """Stored responses per scope (episode, or ``""`` for untraced calls), at most ``max_per_scope`` each.

    Args:
        on_close: The episode tracker's ``on_close``: an episode's responses are freed when it closes.
        max_per_scope: Most responses kept per episode and for untraced calls (``gateway.max_stored_responses``).
    """

    def __init__(self, on_close: OnClose, max_per_scope: int) -> None:
        self._on_close = on_close
        self.max_per_scope = max_per_scope
        self._scopes: dict[str, OrderedDict[str, StoredResponse]] = {}
        self._scope_of: dict[str, str] = {}  # response id -> its scope

    def __len__(self) -> int:
        """How many responses are stored now, every scope together."""
        return len(self._scope_of)

    def put(self, response: StoredResponse) -> bool:
        """Store ``response`` (forgetting its scope's oldest beyond the limit); False, storing nothing, when its
        episode is not open (it was reported meanwhile: nothing could continue it)."""
        scope = self._scopes.get(response.episode_id)
        if scope is None:
            if response.episode_id and not self._on_close(
                response.episode_id, self._closer(response.episode_id)
            ):
                return False
            scope = self._scopes[response.episode_id] = OrderedDict()
        scope[response.id] = response
        self._scope_of[response.id] = response.episode_id
        while len(scope) > self.max_per_scope:
            old, _ = scope.popitem(last=False)
            del self._scope_of[old]
        return True

    def _closer(self, episode_id: str) -> Callable[[], None]:
        def forget() -> None:
            for response_id in self._scopes.pop(episode_id, {}):
                del self._scope_of[response_id]

        return forget

    def get(self, response_id: str, episode_id: str) -> StoredResponse:
        """The stored response ``response_id`` for a request of episode ``episode_id`` (``""``: untraced).

        Raises:
            NotFoundError: No such response is stored (never, not with ``store``, forgotten, or its episode has
                closed), naming ``previous_response_id``.
            InvalidArgumentError: It belongs to another episode (or is traced and the request is not, or the
                reverse), naming ``previous_response_id``.
        """
        scope = self._scope_of.get(response_id)
        if scope is None:
            err = NotFoundError(
                f"previous_response_id {response_id!r} is not stored: unknown, sent with store false, forgotten "
                f"(each episode keeps its last {self.max_per_scope}, gateway.max_stored_responses), or its episode "
                "has ended"
            )
            err.param = "previous_response_id"  # type: ignore[attr-defined]
            raise err
        if scope != episode_id:
            where = f"episode {scope!r}" if scope else "an untraced call"
            here = f"episode {episode_id!r}" if episode_id else "an untraced call"
            raise request_error(
                f"previous_response_id {response_id!r} is a response of {where}, and this request is {here}: a "
                "response can only be continued within its own episode",
                "previous_response_id",
            )
        return self._scopes[scope][response_id]
