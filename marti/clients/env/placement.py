"""Where a pool of env servers puts each session: live sessions per server and the cooldown of servers
whose create failed (:class:`_Placement`), the fall-over from server to server on a create (:func:`_place`),
the session -> server routes (:class:`_Routes`), and :class:`_PoolBase`, the half both pools share (see
:mod:`.pool` for the rules)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from marti.errors import (
    MartiError,
    NotFoundError,
    ResourceExhaustedError,
    SessionLostError,
    UnavailableError,
)
from marti.plumbing.arguments import checked

from .protocol import check_steps
from .types import StepResult

T = TypeVar("T")

#: Seconds a server whose create failed (away, or at its session cap) is placed after every other server; each
#: further failure in a row doubles it (a server that stays down costs one slow create per cooldown).
DOWN_COOLDOWN_S = 5.0
#: The longest cooldown, seconds.
MAX_DOWN_COOLDOWN_S = 60.0
#: Errors of a create that made no session, so the next server may be tried.
_NEXT_SERVER = (UnavailableError, ResourceExhaustedError)


def name_server(err: MartiError, address: str) -> MartiError:
    """Name the env server an error came from: prefix the message with ``env server <address>:`` and set
    ``metadata["env_server"]`` (once; the error keeps its class). Returns ``err``."""
    if "env_server" not in err.metadata:
        err.metadata["env_server"] = address
        err.message = f"env server {address}: {err.message}"
        err.args = (err.message,)
    return err


class _Placement:
    """Live sessions per server of one pool, and which servers failed a create lately (thread-safe)."""

    def __init__(self, n: int) -> None:
        self._live = [0] * n
        self._avoid_until = [0.0] * n
        self._failures = [0] * n  # creates failed in a row per server
        self._lock = threading.Lock()

    def live(self) -> list[int]:
        with self._lock:
            return list(self._live)

    def take(self, tried: set[int]) -> int | None:
        """Reserve the best server not in ``tried`` (fewest live sessions, recently failed ones last, then the
        first listed): its count goes up at once, so concurrent creates spread too. None: all tried."""
        now = time.monotonic()
        with self._lock:
            left = [i for i in range(len(self._live)) if i not in tried]
            if not left:
                return None
            i = min(left, key=lambda k: (self._avoid_until[k] > now, self._live[k], k))
            self._live[i] += 1
            return i

    def release(self, i: int) -> None:
        with self._lock:
            self._live[i] = max(0, self._live[i] - 1)

    def avoid(self, i: int) -> float:
        """Place server ``i`` last for its cooldown (``DOWN_COOLDOWN_S`` doubled per earlier failure in a row, at
        most ``MAX_DOWN_COOLDOWN_S``). Returns the cooldown in seconds."""
        with self._lock:
            self._failures[i] += 1
            cooldown = min(DOWN_COOLDOWN_S * 2 ** min(self._failures[i] - 1, 30), MAX_DOWN_COOLDOWN_S)
            self._avoid_until[i] = time.monotonic() + cooldown
            return cooldown

    def created(self, i: int) -> None:
        """A create succeeded on server ``i``: its next failure starts the cooldown over."""
        with self._lock:
            self._failures[i] = 0


class _Tries:
    """The servers a new session may be created on, best first, each reserved while it is tried."""

    def __init__(self, placement: _Placement, addresses: Sequence[str]) -> None:
        self._placement = placement
        self._addresses = addresses
        self._tried: set[int] = set()
        self.last: MartiError | None = None

    def __iter__(self) -> Iterator[int]:
        while (i := self._placement.take(self._tried)) is not None:
            self._tried.add(i)
            yield i

    def succeeded(self, i: int) -> None:
        """The create on server ``i`` made a session (its place stays taken; its failures in a row end)."""
        self._placement.created(i)

    def failed(self, i: int, err: BaseException) -> bool:
        """Undo server ``i``'s reservation; True when the next server may be tried (``err`` is kept as the
        last error), False when ``err`` must be raised (it is named first when a :class:`MartiError`)."""
        self._placement.release(i)
        if not isinstance(err, MartiError):
            return False
        name_server(err, self._addresses[i])
        if isinstance(err, _NEXT_SERVER):
            self._placement.avoid(i)
            self.last = err
            return True
        return False


class _Routes:
    """Which server each session of one owner (a pool's unary calls, one stream) lives on (thread-safe)."""

    def __init__(self, placement: _Placement, addresses: Sequence[str]) -> None:
        self._placement = placement
        self._addresses = addresses
        self._where: dict[str, int] = {}
        self._lock = threading.Lock()

    def add(self, session_id: str, i: int) -> None:
        with self._lock:
            self._where[session_id] = i

    def server(self, session_id: str) -> int:
        i = self._where.get(session_id)
        if i is None:
            raise NotFoundError(
                f"session {session_id!r} was not created by this env pool, or was closed or lost: the pool "
                "routes only the sessions it created, each to the env server that created it",
                metadata={"session_id": session_id},
            )
        return i

    def drop(self, session_id: str) -> int | None:
        """Forget a session (closed or lost) and free its place; its server, or None when unknown."""
        with self._lock:
            i = self._where.pop(session_id, None)
        if i is not None:
            self._placement.release(i)
        return i

    def drop_all(self) -> None:
        with self._lock:
            gone, self._where = list(self._where.values()), {}
        for i in gone:
            self._placement.release(i)

    def sessions(self) -> dict[str, str]:
        with self._lock:
            return {s: self._addresses[i] for s, i in self._where.items()}

    def failed(self, session_id: str, i: int, err: MartiError) -> MartiError:
        """Name the server of a failed call; a lost session is forgotten. Returns ``err``."""
        if isinstance(err, SessionLostError):
            self.drop(session_id)
        return name_server(err, self._addresses[i])

    def split(self, steps: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[int, list[int]]:
        """Server -> the indexes of its steps, in request order (every session checked before any is sent).

        Raises:
            InvalidArgumentError: ``steps`` is not a sequence of pairs (:func:`.protocol.check_steps`).
            NotFoundError: A session the pool did not create.
        """
        check_steps(steps)
        groups: dict[int, list[int]] = {}
        for k, (session_id, _) in enumerate(steps):
            groups.setdefault(self.server(session_id), []).append(k)
        return groups

    def settle(
        self,
        i: int,
        idx: list[int],
        steps: Sequence[tuple[str, Mapping[str, Any]]],
        results: Sequence[StepResult | MartiError],
        out: list[Any],
    ) -> None:
        """Put server ``i``'s batch results in their request slots (errors named, lost sessions forgotten)."""
        for k, r in zip(idx, results, strict=True):
            out[k] = self.failed(steps[k][0], i, r) if isinstance(r, MartiError) else r


def _common_envs(listings: Sequence[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The envs every server offers (by ``env_id``), as the first server describes them, in its order."""
    ids = set.intersection(*({e["env_id"] for e in listing} for listing in listings))
    return [e for e in listings[0] if e["env_id"] in ids]


def _place(placement: _Placement, addresses: Sequence[str], create: Callable[[int], T]) -> tuple[int, T]:
    """Create on the best server, falling over to the next one while creates fail with UNAVAILABLE or
    RESOURCE_EXHAUSTED; returns ``(server, what create returned)`` with the server's place still taken."""
    tries = _Tries(placement, addresses)
    for i in tries:
        try:
            made = create(i)
        except BaseException as e:
            if not tries.failed(i, e):
                raise
        else:
            tries.succeeded(i)
            return i, made
    assert tries.last is not None
    raise tries.last


class _PoolBase:
    """What the sync and async pools share: the servers, their placement, and the unary calls' routes."""

    addresses: tuple[str, ...]

    def _init_routes(self) -> None:
        self._placement = _Placement(len(self.addresses))
        self._routes = _Routes(self._placement, self.addresses)

    @checked
    def server_of(self, session_id: str) -> str:
        """The address of the server a session (made by this pool's ``create_session``) lives on.

        Raises:
            NotFoundError: The pool did not create the session, or has seen it closed or lost.
        """
        return self.addresses[self._routes.server(session_id)]

    def live_sessions(self) -> dict[str, int]:
        """Address -> live sessions of this pool on that server (unary, stream and env sessions together)."""
        return dict(zip(self.addresses, self._placement.live(), strict=True))
