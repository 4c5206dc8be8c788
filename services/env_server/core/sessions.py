"""Sessions: one fresh environment per session, a session cap, idle reaping and idempotent requests.

Pure Python (no grpc). Two faces over the same bookkeeping:

- the plain methods (:meth:`SessionManager.create`, ``reset``, ``step``, ``close``, ...) run the env call in the
  caller's thread; in-process users and unit tests call them from one thread (the manager is not thread-safe);
- the ``*_async`` methods are what the env server calls from its event loop: every env call (create, reset,
  step, close, and the listing of env ids, which may build envs) runs on a bounded pool of ``workers`` threads,
  so one slow env never stalls the loop and the other sessions. A session's calls run one at a time, in the
  order they arrived (a FIFO lock per session), since envs are not assumed thread-safe; when every worker is
  busy, further calls wait in the pool's queue (no error). The bookkeeping (the session table, the cap, the
  idempotency windows) stays on the loop; a session's env and its window of results are only touched by the
  call holding that session. A batch of steps (:meth:`SessionManager.step_batch_async`) runs its sessions'
  steps in few worker jobs rather than one each.

Every reset and step outcome is numbered within its session (``Outcome.result_id``) and the newest is kept as
``Session.last``, the base against which the server encodes the next step as a delta when the client holds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from itertools import islice
from typing import Any, TypeVar

from marti.env.registry import Registry
from marti.errors import (
    AlreadyExistsError,
    InternalError,
    InvalidArgumentError,
    MartiError,
    ResourceExhaustedError,
    SessionLostError,
)
from services.env_server.core.session_state import BatchItem, Outcome, Session, next_outcome

_LOG = logging.getLogger(__name__)
T = TypeVar("T")

#: Most worker threads a :class:`SessionManager` may run env calls on (``EnvServerSettings.step_workers``).
MAX_WORKERS = 1024
#: Most sessions of one batch whose steps run one after another in one worker job (see
#: :meth:`SessionManager.step_batch_async`).
BATCH_JOB_SESSIONS = 64
#: A batch job hands its group's remaining sessions to one worker job each (run side by side) once one step took
#: this long, seconds: far above a CPU-bound text env's step (about 0.1 ms), below an env waiting on a model.
BATCH_SLOW_STEP_S = 0.1
#: ... or once one step spent this much longer than its thread's CPU time, seconds: the env waited (I/O, a sleep,
#: a model call; or the thread was preempted on a loaded machine), so the rest had better run side by side ...
BATCH_WAIT_S = 0.002
#: ... or once the job has run this long in all, seconds (64 steps of a CPU-bound text env take about 6-30 ms).
BATCH_JOB_BUDGET_S = 0.05


def _same(value: Any, base: Any = None) -> Any:
    return value


def _same_item(index: int, value: Any, base: Any = None) -> Any:
    return value


class SessionManager:
    """Creates, steps, resets, closes and reaps sessions.

    Args:
        registry: Where env ids are resolved.
        max_sessions: Cap on concurrent sessions; creating one more is ``ResourceExhaustedError`` naming it.
        idle_timeout_s: Sessions unused this long are closed by :meth:`reap_idle`, seconds.
        idempotency_window: How many recent request ids each session (and the create path) remembers.
        idempotency_results: Of those, how many newest ones keep their whole outcome (every agent's observation
            and infos), so that a retry gets it again; an older id is kept as its ``result_id`` only, and a retry
            of it is refused (``AlreadyExistsError``) instead of applied twice. A batch naming a session ``n``
            times holds that session's ``n`` newest, so a retry of the whole batch replays it. Two callers
            stepping one session at once can see a refusal where one retries after the other's step. A held
            outcome costs about 6 KB on ``resource_allocation``; 64 of them made a used session about 10x an
            idle one (docs/benchmarks.md, "Scale").
        clock: Monotonic clock in seconds (injectable for tests).
        workers: Threads the ``*_async`` methods run env calls on (1..:data:`MAX_WORKERS`); started on first
            use, so a manager used only through the plain methods starts none.

    Raises:
        InvalidArgumentError: A limit below 1 (or a non-positive timeout, or ``workers`` out of range).
    """

    def __init__(
        self,
        registry: Registry,
        max_sessions: int = 1024,
        idle_timeout_s: float = 600.0,
        idempotency_window: int = 64,
        clock: Callable[[], float] = time.monotonic,
        workers: int = 32,
        idempotency_results: int = 1,
    ) -> None:
        if max_sessions < 1:
            raise InvalidArgumentError(f"max_sessions must be >= 1, got {max_sessions}")
        if idle_timeout_s <= 0:
            raise InvalidArgumentError(f"idle_timeout_s must be > 0, got {idle_timeout_s}")
        if idempotency_window < 1:
            raise InvalidArgumentError(f"idempotency_window must be >= 1, got {idempotency_window}")
        if not 1 <= idempotency_results <= idempotency_window:
            raise InvalidArgumentError(
                f"idempotency_results must be in 1..idempotency_window ({idempotency_window}), "
                f"got {idempotency_results}"
            )
        if not 1 <= workers <= MAX_WORKERS:
            raise InvalidArgumentError(f"workers must be in 1..{MAX_WORKERS}, got {workers}")
        self.registry = registry
        self.max_sessions = max_sessions
        self.idle_timeout_s = idle_timeout_s
        self.idempotency_window = idempotency_window
        self.idempotency_results = idempotency_results
        self.clock = clock
        self.workers = workers
        self._sessions: dict[str, Session] = {}
        self._created: OrderedDict[str, str] = OrderedDict()  # create request id -> session id
        self._creating: dict[str, asyncio.Future] = {}  # create request id -> its env build in flight
        self._reserved = 0  # creates in flight (count against max_sessions)
        self._closing: set[asyncio.Task] = set()
        self._batches: set[asyncio.Task] = set()
        self._registry_lock = threading.Lock()  # provider loading mutates the registry
        self._pool: ThreadPoolExecutor | None = None

    def __len__(self) -> int:
        return len(self._sessions)

    def session_ids(self) -> list[str]:
        """Ids of the live sessions."""
        return list(self._sessions)

    # ---- shared pieces ----
    def _check_cap(self) -> None:
        if len(self._sessions) + self._reserved >= self.max_sessions:
            raise ResourceExhaustedError(
                f"session cap reached: max_sessions={self.max_sessions}; close sessions or raise the cap"
            )

    def _build(
        self, env_id: str, config: Mapping[str, Any] | None, seed: int | None, owner: str | None
    ) -> Session:
        with self._registry_lock:
            resolved = self.registry.resolve(env_id).env_id  # loads the provider once, under the lock
        env = self.registry.make(resolved, config, seed)
        return Session(secrets.token_hex(12), resolved, env, owner, self.clock())

    def _register(self, session: Session, request_id: str) -> Session:
        self._sessions[session.session_id] = session
        if request_id:
            self._created[request_id] = session.session_id
            while len(self._created) > self.idempotency_window * 16:
                self._created.popitem(last=False)
        return session

    def specs(self) -> list[Any]:
        """Every registered :class:`~marti.env.registry.EnvSpec` (loads every provider; safe from a worker)."""
        with self._registry_lock:
            return self.registry.specs()

    def _lost(self, session_id: str) -> SessionLostError:
        return SessionLostError(
            f"unknown session {session_id!r}: closed, reaped after {self.idle_timeout_s:g}s idle, lost in "
            "an env server restart, or never created; create a new session (a marti.make(address=...) "
            "env: call reset())",
            session_id=session_id,
        )

    def _touch(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise self._lost(session_id)
        session.last_used_s = self.clock()
        return session

    def get(self, session_id: str) -> Session:
        """Return a live session and mark it used.

        Raises:
            SessionLostError: Unknown, closed or reaped session (named; a ``NotFoundError``).
        """
        return self._touch(session_id)

    def _remember(self, session: Session, request_id: str, outcome: Outcome, hold: int = 0) -> Outcome:
        """Record ``outcome`` under ``request_id``; keep whole only the newest ``max(idempotency_results, hold)``
        outcomes of the session (``hold``: the session's items in the batch being run, so that a retry of the
        whole batch replays every one of them)."""
        if request_id:
            results = session.results
            results[request_id] = outcome
            while len(results) > self.idempotency_window:
                results.popitem(last=False)
            keep = max(self.idempotency_results, hold)
            # the newest but ``keep``: id only (a value assigned to an existing key does not disturb the iteration)
            for older in islice(reversed(results), keep, None):
                held = results[older]
                if not isinstance(held, Outcome):
                    break  # everything older was demoted before
                results[older] = held.result_id
        return outcome

    def _replayed(self, session: Session, request_id: str) -> Outcome | None:
        """The held outcome of a retried ``request_id``; ``None`` for a new one.

        Raises:
            AlreadyExistsError: The id was applied, but its outcome is no longer held.
        """
        held = session.results.get(request_id) if request_id else None
        if held is None or isinstance(held, Outcome):
            return held
        raise AlreadyExistsError(
            f"request_id {request_id!r} of session {session.session_id} was already applied (result {held}); "
            f"only the newest idempotency_results={self.idempotency_results} outcomes are held for a retry, "
            "so it is not applied again"
        )

    def _reset_job(
        self, session: Session, seed: int | None, options: dict | None, request_id: str, post: Callable
    ) -> Callable[[], Any]:
        def job() -> Any:
            if session.closed:
                raise self._lost(session.session_id)
            cached = self._replayed(session, request_id)
            if cached is not None:
                return post(cached, None)
            obs, infos = self._call(session, lambda: session.env.reset(seed=seed, options=options or None))
            return post(self._remember(session, request_id, next_outcome(session, obs, infos)[0]), None)

        return job

    def _step_job(
        self,
        session: Session,
        actions: Mapping[str, Any],
        request_id: str,
        post: Callable,
        delta_base: int = 0,
        hold: int = 0,
    ) -> Callable[[], Any]:
        def job() -> Any:
            if session.closed:
                raise self._lost(session.session_id)
            cached = self._replayed(session, request_id)
            if cached is not None:
                return post(cached, None)
            obs, rew, term, trunc, infos = self._call(
                session, lambda: session.env.step(dict(actions) if isinstance(actions, Mapping) else actions)
            )
            outcome, prev = next_outcome(session, obs, infos, rew, term, trunc)
            base = prev if delta_base and prev is not None and prev.result_id == delta_base else None
            return post(self._remember(session, request_id, outcome, hold), base)

        return job

    @staticmethod
    def _call(session: Session, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except MartiError:
            raise
        except Exception as e:  # an env bug: report it, keep the server and the other sessions alive
            raise InternalError(f"env {session.env_id} raised {type(e).__name__}: {e}") from e

    @staticmethod
    def _close_env(session: Session) -> None:
        session.closed = True
        try:
            session.env.close()
        except Exception:  # noqa: BLE001 - closing must not fail the caller
            _LOG.warning(
                "env %s of session %s failed to close", session.env_id, session.session_id, exc_info=True
            )

    def _idle_ids(self, now_s: float | None) -> list[str]:
        now_s = self.clock() if now_s is None else now_s
        return [
            sid
            for sid, s in self._sessions.items()
            if s.pending == 0 and now_s - s.last_used_s >= self.idle_timeout_s
        ]

    # ---- plain (same-thread) API ----
    def create(
        self,
        env_id: str,
        config: Mapping[str, Any] | None = None,
        seed: int | None = None,
        owner: str | None = None,
        request_id: str = "",
    ) -> Session:
        """Create a session holding a fresh env instance.

        Args:
            env_id: Env id (see :meth:`Registry.resolve`).
            config: Env config.
            seed: Seed of the first reset without a seed.
            owner: Owner tag (e.g. a stream id) for :meth:`close_owned`.
            request_id: When non-empty and seen before (and the session still lives), that session is returned.

        Returns:
            The new (or, on a retry, the earlier) :class:`Session`.

        Raises:
            ResourceExhaustedError: ``max_sessions`` reached (named).
            NotFoundError: Unknown env id.
            InvalidArgumentError: Bad config or seed.
        """
        if request_id and self._created.get(request_id) in self._sessions:
            return self._touch(self._created[request_id])
        self._check_cap()
        return self._register(self._build(env_id, config, seed, owner), request_id)

    def reset(
        self, session_id: str, seed: int | None = None, options: dict | None = None, request_id: str = ""
    ) -> Outcome:
        """Reset a session's env.

        Args:
            session_id: The session.
            seed: Reseeds the env (``None`` continues its stream).
            options: PettingZoo reset options.
            request_id: Retrying with the same id returns the first outcome without resetting again.

        Returns:
            Observations and infos of every live agent.

        Raises:
            SessionLostError: Unknown session (a ``NotFoundError``).
            InvalidArgumentError: Bad seed.
        """
        return self._reset_job(self._touch(session_id), seed, options, request_id, _same)()

    def step(self, session_id: str, actions: Mapping[str, Any], request_id: str = "") -> Outcome:
        """Step a session's env.

        Args:
            session_id: The session.
            actions: Agent -> action.
            request_id: Retrying with the same id returns the first outcome without stepping again.

        Returns:
            PettingZoo step results for the agents live before the step.

        Raises:
            SessionLostError: Unknown session (a ``NotFoundError``).
            FailedPreconditionError: Step before reset or after the episode ended.
            InvalidArgumentError: Unknown or done agent, missing action, oversized or malformed action.
        """
        return self._step_job(self._touch(session_id), actions, request_id, _same)()

    def close(self, session_id: str) -> bool:
        """Close a session (idempotent).

        Returns:
            True when the session existed.
        """
        session = self._sessions.pop(session_id, None)
        if session is None:
            return False
        self._close_env(session)
        return True

    def close_owned(self, owner: str) -> int:
        """Close every session of ``owner``; returns how many were closed."""
        ids = [sid for sid, s in self._sessions.items() if s.owner == owner]
        for sid in ids:
            self.close(sid)
        return len(ids)

    def reap_idle(self, now_s: float | None = None) -> list[str]:
        """Close sessions idle for at least ``idle_timeout_s`` (a session with a call running or queued is not
        idle).

        Args:
            now_s: Current monotonic time (default: the clock).

        Returns:
            Ids of the closed sessions.
        """
        idle = self._idle_ids(now_s)
        for sid in idle:
            self.close(sid)
        return idle

    def close_all(self) -> int:
        """Close every session (server shutdown); returns how many."""
        ids = list(self._sessions)
        for sid in ids:
            self.close(sid)
        return len(ids)

    # ---- event-loop API: env calls on the worker pool ----
    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="marti-env")
        return self._pool

    async def offload(self, fn: Callable[[], T]) -> T:
        """Run a blocking call that belongs to no session (e.g. listing env ids) on the worker pool.

        Args:
            fn: The call; it runs in a worker thread.

        Returns:
            What ``fn`` returned (its exception is raised here).
        """
        return await asyncio.shield(asyncio.get_running_loop().run_in_executor(self._executor(), fn))

    async def _serially(self, session: Session, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the pool while holding ``session``: after the calls that arrived before it, alone.

        A caller cancelled while ``fn`` runs (deadline, client gone, shutdown past its grace) stops waiting, but
        the session stays held until ``fn`` really ends, so the next call never overlaps it.
        """
        session.pending += 1
        try:
            await session.lock.acquire()
        except BaseException:
            session.pending -= 1
            raise
        try:
            fut = asyncio.get_running_loop().run_in_executor(self._executor(), fn)
        except BaseException:
            session.lock.release()
            session.pending -= 1
            raise

        def done(_: asyncio.Future) -> None:
            session.last_used_s = self.clock()
            session.pending -= 1
            session.lock.release()

        fut.add_done_callback(done)
        return await asyncio.shield(fut)

    async def create_async(
        self,
        env_id: str,
        config: Mapping[str, Any] | None = None,
        seed: int | None = None,
        owner: str | None = None,
        request_id: str = "",
        post: Callable[[Session], T] = _same,
    ) -> T:
        """:meth:`create` with the env built on the worker pool.

        Args:
            env_id: Env id.
            config: Env config.
            seed: Seed of the first reset without a seed.
            owner: Owner tag for :meth:`close_owned_async`.
            request_id: A retry with the same id (also while the first is still being built) gets the same
                session.
            post: Runs in the worker right after the build (before the session is visible), e.g. to describe
                the env's spaces; on a retry it runs while holding the session.

        Returns:
            ``post(session)``.

        Raises:
            ResourceExhaustedError: ``max_sessions`` reached, counting creates in flight (named).
            NotFoundError: Unknown env id.
            InvalidArgumentError: Bad config or seed.
        """
        if request_id and request_id in self._creating:
            with contextlib.suppress(Exception):  # the first attempt's error is its own; this one retries
                await asyncio.shield(self._creating[request_id])
        if request_id and self._created.get(request_id) in self._sessions:
            session = self._touch(self._created[request_id])
            return await self._serially(session, lambda: post(session))
        self._check_cap()
        self._reserved += 1

        def build() -> tuple[Session, Any]:
            session = self._build(env_id, config, seed, owner)
            try:
                return session, post(session)
            except BaseException:
                self._close_env(session)
                raise

        fut = asyncio.get_running_loop().run_in_executor(self._executor(), build)
        if request_id:
            self._creating[request_id] = fut

        def done(f: asyncio.Future) -> None:  # on the loop, even when the caller was cancelled
            self._reserved -= 1
            if request_id and self._creating.get(request_id) is f:
                del self._creating[request_id]
            if not f.cancelled() and f.exception() is None:
                self._register(f.result()[0], request_id)

        fut.add_done_callback(done)
        return (await asyncio.shield(fut))[1]

    async def reset_async(
        self,
        session_id: str,
        seed: int | None = None,
        options: dict | None = None,
        request_id: str = "",
        post: Callable[[Outcome, None], T] = _same,
    ) -> T:
        """:meth:`reset` on the worker pool, in order with the session's other calls.

        Args:
            session_id: The session.
            seed: Reseeds the env.
            options: PettingZoo reset options.
            request_id: Retrying with the same id returns the first outcome without resetting again.
            post: Runs in the worker on the outcome (and ``None``: a reset has no delta base) while the session
                is held (e.g. encoding it).

        Returns:
            ``post(outcome, None)``.

        Raises:
            SessionLostError: Unknown session, or closed while this call waited for it.
            InvalidArgumentError: Bad seed.
        """
        session = self._touch(session_id)
        return await self._serially(session, self._reset_job(session, seed, options, request_id, post))

    async def step_async(
        self,
        session_id: str,
        actions: Mapping[str, Any],
        request_id: str = "",
        post: Callable[[Outcome, Outcome | None], T] = _same,
        delta_base: int = 0,
    ) -> T:
        """:meth:`step` on the worker pool, in order with the session's other calls.

        Args:
            session_id: The session.
            actions: Agent -> action.
            request_id: Retrying with the same id returns the first outcome without stepping again (a retry
                that arrives while the first is running waits for it).
            post: Runs in the worker on the outcome and its delta base while the session is held (e.g. encoding
                it).
            delta_base: The ``result_id`` of the outcome the caller holds: when it is the session's last outcome
                as the step runs, ``post`` gets that outcome as the base; otherwise (or for a retried request
                id, or 0) it gets ``None``.

        Returns:
            ``post(outcome, base)``.

        Raises:
            SessionLostError: Unknown session, or closed while this call waited for it.
            FailedPreconditionError: Step before reset or after the episode ended.
            InvalidArgumentError: Unknown or done agent, missing action, oversized or malformed action.
        """
        session = self._touch(session_id)
        return await self._serially(session, self._step_job(session, actions, request_id, post, delta_base))

    async def step_batch_async(
        self,
        items: Sequence[BatchItem],
        post: Callable[[int, Outcome, Outcome | None], T] = _same_item,
    ) -> list[T | Exception]:
        """Step many sessions with few worker jobs: what ``BatchStep`` runs.

        Each item is what :meth:`step_async` would do alone, with the same guarantees (a session's calls run
        alone and in arrival order; errors stay with their item). To spare a worker hand-off per step, the
        batch's sessions that no other call holds or waits for are taken at once and split into groups of at
        most :data:`BATCH_JOB_SESSIONS`, each group's steps run one after another in one worker job, the groups
        side by side; a session another call holds is stepped on its own once that call is done, so the batch
        never waits for it while holding others. A job hands its group's remaining sessions to one worker job
        each, run side by side, after a step that took :data:`BATCH_SLOW_STEP_S`, or waited
        :data:`BATCH_WAIT_S` beyond its CPU time, or once the job has run :data:`BATCH_JOB_BUDGET_S`: an env
        that waits on I/O or a model then runs its steps side by side after the first. Each session is released
        as soon as its own steps are done, not when the whole group is. A session named by several items has its
        steps run in item order.

        Args:
            items: The steps, in order.
            post: As for :meth:`step_async`, called with the item's index first: ``post(i, outcome, base)``.

        Returns:
            Per item, in order: ``post(i, outcome, base)``, or the exception that step raised
            (``SessionLostError`` for an unknown session, the env's errors, ...).
        """
        out: list[Any] = [None] * len(items)
        groups: dict[str, list[int]] = {}
        found: dict[str, Session] = {}
        for i, item in enumerate(items):
            session = self._sessions.get(item.session_id)
            if session is None:
                out[i] = self._lost(item.session_id)
                continue
            session.last_used_s = self.clock()
            found[item.session_id] = session
            groups.setdefault(item.session_id, []).append(i)
        free = [sid for sid in groups if found[sid].pending == 0]
        busy = [sid for sid in groups if found[sid].pending != 0]
        for sid in free:  # nobody holds or waits for these locks: acquire() returns without suspending
            found[sid].pending += 1
            await found[sid].lock.acquire()
        parts = [free[k : k + BATCH_JOB_SESSIONS] for k in range(0, len(free), BATCH_JOB_SESSIONS)]
        tasks = [
            self._start_group([(found[sid], groups[sid]) for sid in part], items, post, out) for part in parts
        ]
        waits = [asyncio.shield(t) for t in tasks] + [
            self._serially(found[sid], partial(self._run_items, found[sid], groups[sid], items, post, out))
            for sid in busy
        ]
        if waits:
            await asyncio.gather(*waits)
        return out

    def _run_items(
        self, session: Session, idxs: list[int], items: Sequence[BatchItem], post: Callable, out: list[Any]
    ) -> None:
        """Run a session's batch items in order (in a worker, the session held); each keeps its own error."""
        for i in idxs:
            it = items[i]
            try:
                job = self._step_job(
                    session, it.actions, it.request_id, partial(post, i), it.delta_base, hold=len(idxs)
                )
                out[i] = job()
            except Exception as e:  # noqa: BLE001 - each item keeps its own error
                out[i] = e

    def _start_group(
        self,
        group: list[tuple[Session, list[int]]],
        items: Sequence[BatchItem],
        post: Callable,
        out: list[Any],
    ) -> asyncio.Task:
        """Start the worker jobs of a group whose sessions the caller holds; each session is released when its
        steps have really ended (even if the caller is cancelled meanwhile)."""
        loop = asyncio.get_running_loop()
        released: set[str] = set()

        def release(s: Session) -> None:
            if s.session_id in released:
                return
            released.add(s.session_id)
            s.last_used_s = self.clock()
            s.pending -= 1
            s.lock.release()

        def run(pairs: list[tuple[Session, list[int]]], hand_off: bool) -> int:
            """Run the pairs' steps in order (in a worker); with ``hand_off``, stop before the next session after
            a slow or waiting step or past the budget; returns how many pairs ran."""
            t0 = time.perf_counter()
            waited = False
            for n, (session, idxs) in enumerate(pairs):
                if hand_off and n and (waited or time.perf_counter() - t0 >= BATCH_JOB_BUDGET_S):
                    return n
                wall0, cpu0 = time.perf_counter(), time.thread_time()
                self._run_items(session, idxs, items, post, out)
                wall = time.perf_counter() - wall0
                waited = wall >= BATCH_SLOW_STEP_S or wall - (time.thread_time() - cpu0) >= BATCH_WAIT_S
                loop.call_soon_threadsafe(release, session)
            return len(pairs)

        async def body() -> None:
            ran = await loop.run_in_executor(self._executor(), run, group, True)
            if ran < len(group):
                await asyncio.gather(
                    *(loop.run_in_executor(self._executor(), run, [pair], False) for pair in group[ran:])
                )

        task = loop.create_task(body())
        self._batches.add(task)

        def done(t: asyncio.Task) -> None:
            self._batches.discard(t)
            for s, _ in group:
                release(s)

        task.add_done_callback(done)
        return task

    def _start_close(self, session: Session) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(
            self._serially(session, lambda: self._close_env(session))
        )
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        return task

    async def close_async(self, session_id: str) -> bool:
        """Close a session (idempotent): new calls fail at once; calls that arrived earlier run first, then the
        env is closed on the worker pool.

        Returns:
            True when the session existed.
        """
        session = self._sessions.pop(session_id, None)
        if session is None:
            return False
        await asyncio.shield(self._start_close(session))
        return True

    async def _close_many(self, ids: list[str]) -> None:
        tasks = [
            self._start_close(s) for s in (self._sessions.pop(sid, None) for sid in ids) if s is not None
        ]
        if tasks:
            await asyncio.shield(asyncio.wait(tasks))

    async def close_owned_async(self, owner: str) -> int:
        """Close every session of ``owner`` (see :meth:`close_async`); returns how many."""
        ids = [sid for sid, s in self._sessions.items() if s.owner == owner]
        await self._close_many(ids)
        return len(ids)

    async def reap_idle_async(self, now_s: float | None = None) -> list[str]:
        """:meth:`reap_idle` with the envs closed on the worker pool.

        Args:
            now_s: Current monotonic time (default: the clock).

        Returns:
            Ids of the closed sessions.
        """
        idle = self._idle_ids(now_s)
        await self._close_many(idle)
        return idle

    async def close_all_async(self, timeout_s: float | None = None) -> int:
        """Close every session after its running and queued calls end (server shutdown), then stop the pool.

        Args:
            timeout_s: Longest wait for those calls, seconds (``None``: no limit); an env still busy then is
                left unclosed (logged) and its thread finishes on its own.

        Returns:
            How many sessions there were.
        """
        ids = list(self._sessions)
        for sid in ids:
            self._start_close(self._sessions.pop(sid))
        if self._closing:
            _, busy = await asyncio.wait(set(self._closing), timeout=timeout_s)
            if busy:
                _LOG.warning("%d env sessions still busy after %.1fs; not closed", len(busy), timeout_s or 0)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=False)
            self._pool = None
        return len(ids)
