"""The gateway facade: resolve a model name, batch the call into the engine, record its trace, take rewards.

Both adapters (OpenAI-compatible HTTP in the ``http`` package, gRPC in ``servicer.py``) call only this class, so the
two protocols behave the same and raise the same :mod:`marti.errors` types (mapped to HTTP codes in one place,
to gRPC status codes by the shared interceptor).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import unicodedata
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from marti.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
)
from marti.types.inference import ChatMessages, Generation, SamplingParams, StaleCalls
from marti.types.tools import DEFAULT_TOOL_PARSER, ChatReply
from services.gateway.core.backend import InferenceBackend
from services.gateway.core.batcher import RequestBatcher
from services.gateway.core.calls import (
    CallInFlight,
    ModelCard,
    Reported,
    Served,
    fingerprint,
)
from services.gateway.core.chat import ChatPrompts
from services.gateway.core.delivery import EpisodeDelivery, EpisodeSink
from services.gateway.core.limits import GatewayLimits
from services.gateway.core.loop_lag import LoopLagProbe
from services.gateway.core.tools import Parsed, ToolParser
from services.gateway.core.tools import tool_parser as tools_parser
from services.gateway.core.tools.parsers import derived_call_id
from services.gateway.core.traces import EpisodeTracker, Released

_LOG = logging.getLogger("marti.gateway")

#: Asks the adapter whether the caller went away (HTTP client disconnected, gRPC call cancelled).
Disconnected = Callable[[], Awaitable[bool]]


#: Most token ids of a prompt given as ids that are checked on the event loop (a longer one is checked in a thread).
INLINE_IDS = 8192


def _given_ids(prompt: object) -> bool:
    """Whether ``prompt`` is token ids short enough (:data:`INLINE_IDS`) to check on the event loop."""
    return (
        isinstance(prompt, list) and len(prompt) <= INLINE_IDS and (not prompt or isinstance(prompt[0], int))
    )


def _retrieve(task: asyncio.Future[Served]) -> None:
    """Mark a call task's error as seen (its callers, when any are left, receive it themselves)."""
    if not task.cancelled():
        task.exception()


class Gateway:
    """Serves every agent's policy, batched, and turns finished external episodes into training data.

    Args:
        backend: The policies.
        limits: Batching and limits.
        sink: Where released episodes go (the job's store tables); None = traces are kept only in counters.
        trainable: Agents whose traces become training data (default: every served agent).
        max_staleness: Per trainable agent, the training job's staleness bound (policy versions a trained item
            may lag behind the learner); a report then says which calls are already past it
            (:attr:`Reported.stale`). None = no bound known (nothing is said).
        tool_parser: The tool-call parser of every agent not in ``tool_parsers`` (``gateway.tool_parser``).
        tool_parsers: agent -> its own tool-call parser (``gateway.tool_parsers``).

    Raises:
        InvalidArgumentError: An unknown tool parser name (the known ones are named).
    """

    def __init__(
        self,
        backend: InferenceBackend,
        limits: GatewayLimits | None = None,
        sink: EpisodeSink | None = None,
        trainable: Sequence[str] | None = None,
        max_staleness: Mapping[str, int] | None = None,
        tool_parser: str = DEFAULT_TOOL_PARSER,
        tool_parsers: Mapping[str, str] | None = None,
    ) -> None:
        self._default_parser = tools_parser(tool_parser)
        self._parsers = {a: tools_parser(name) for a, name in (tool_parsers or {}).items()}
        self.tool_calls_unparsed = 0
        self.backend = backend
        self.max_staleness = dict(max_staleness or {})
        self.limits = limits or GatewayLimits()
        self.delivery = EpisodeDelivery(sink, self.limits.max_backlog_episodes, self.limits.report_wait_s)
        self.batcher = RequestBatcher(
            backend.generate,
            max_batch=self.limits.max_batch,
            max_wait_ms=self.limits.max_wait_ms,
            max_queue=self.limits.max_queue,
        )
        self.tracker = EpisodeTracker(
            list(trainable) if trainable is not None else backend.agents(),
            episode_timeout_s=self.limits.episode_timeout_s,
            max_open_episodes=self.limits.max_open_episodes,
            max_calls_per_episode=self.limits.max_calls_per_episode,
            max_group_size=self.limits.max_group_size,
        )
        per_episode = self.limits.max_calls_per_episode * max(1, len(backend.agents()))
        self.chats = ChatPrompts(backend, self.tool_parser, self.tracker, per_episode)
        self._sweeper: asyncio.Task[None] | None = None
        #: The serving loop's lag (started by :meth:`start`; ``loop_lag_ms_*`` in :meth:`stats`).
        self.loop_lag = LoopLagProbe()
        self._lag_task: asyncio.Task[None] | None = None
        self._replays: dict[tuple[str, str], CallInFlight] = {}  # (episode, idempotency key) -> its call
        self.untraced_calls = 0
        self.unrecorded_disconnected = 0
        self.cancelled_calls = 0
        self.replayed_calls = 0
        self.stale_reported = 0
        self.held_lost_at_close = 0
        self.open_lost_at_close = 0

    @property
    def sink(self) -> EpisodeSink | None:
        """Where released episodes go (None: only counted)."""
        return self.delivery.sink

    @property
    def closing(self) -> threading.Event:
        """Set when :meth:`close` begins: queued episodes are no longer handed to the sink, and a sink waiting for
        room should give up (the trainer's sink passes it to ``EpisodeWriter.insert_episode``)."""
        return self.delivery.closing

    # ------------------------------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Start the sweeper that abandons silent episodes and the loop-lag probe (call on the serving loop)."""
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())
        self._lag_task = asyncio.get_running_loop().create_task(self.loop_lag.run())

    async def close(self) -> None:
        """Stop the sweeper and the batcher (queued requests fail with UNAVAILABLE: shutting down) and end the
        backlog: :attr:`closing` is set, so episodes still waiting for the sink are not inserted; the insert in
        flight gets up to :data:`~services.gateway.core.delivery.CLOSE_DELIVERY_WAIT_S` seconds. Every backlog
        episode not inserted is counted in ``backlog_lost_at_close`` and logged as lost to training. Finished
        episodes held for their incomplete group are counted in ``held_lost_at_close`` and episodes never reported
        in ``open_lost_at_close`` (both logged with a warning when not 0): no report can complete them once the
        gateway is closing."""
        self.closing.set()
        self.held_lost_at_close = self.tracker.held
        self.open_lost_at_close = self.tracker.open_episodes
        if self.held_lost_at_close or self.open_lost_at_close:
            _LOG.warning(
                "the gateway is closing with %d finished episodes held for their incomplete groups "
                "(gateway/held_lost_at_close) and %d episodes not reported yet (gateway/open_lost_at_close): "
                "they are lost to training",
                self.held_lost_at_close,
                self.open_lost_at_close,
            )
        for task in (self._sweeper, self._lag_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await self.delivery.close()
        await self.batcher.close()

    async def _sweep_forever(self) -> None:
        period = min(1.0, self.limits.episode_timeout_s / 4)
        while True:
            await asyncio.sleep(period)
            dropped = self.tracker.sweep().dropped
            if dropped:
                _LOG.warning(
                    "dropped %d external episodes (abandoned with their groups, or held in a group that expired)",
                    dropped,
                )

    # ------------------------------------------------------------------------------------------ models
    def models(self) -> list[ModelCard]:
        """Every servable model name: each agent, then each resident version of it."""
        versions = self.backend.versions()
        out = []
        for agent in self.backend.agents():
            out.append(ModelCard(agent, agent, versions[agent], False))
            out.extend(
                ModelCard(f"{agent}@{v}", agent, v, True) for v in self.backend.resident_versions(agent)
            )
        return out

    def resolve(self, model: str) -> tuple[str, int | None]:
        """Map a model name to ``(agent, version or None for the current)``.

        Raises:
            NotFoundError: No such agent, a malformed version (only ASCII digits without leading zeros are
                one), or a version that is not resident (the resident ones are named).
        """
        agent, sep, ver = model.partition("@")
        agents = self.backend.agents()
        if agent not in agents:
            raise NotFoundError(f"model {model!r} does not exist; this gateway serves {agents}")
        if not sep:
            return agent, None
        resident = self.backend.resident_versions(agent)
        # one name per version: ASCII digits without leading zeros, as GET /v1/models lists them
        if not (ver.isascii() and ver.isdigit()) or ver != str(int(ver)) or int(ver) not in resident:
            raise NotFoundError(
                f"model {model!r} is not resident; versions of {agent!r} that can be pinned: {resident}"
            )
        return agent, int(ver)

    # ------------------------------------------------------------------------------------------ serving
    def prompt_ids(self, agent: str, prompt: ChatMessages | str | list[int]) -> list[int]:
        """Token ids of a chat conversation (the agent's chat template), raw text, or ids as given.

        Raises:
            InvalidArgumentError: An empty or malformed prompt, or a token id outside the agent's vocabulary.
        """
        if isinstance(prompt, str):
            ids = self.backend.encode(agent, prompt)
        elif prompt and isinstance(prompt[0], dict):
            ids = self.backend.chat_prompt(agent, prompt)  # type: ignore[arg-type]
        else:
            ids = [int(t) for t in prompt]  # type: ignore[union-attr]
        return self._checked_ids(agent, ids)

    def _checked_ids(self, agent: str, ids: list[int]) -> list[int]:
        """``ids`` when they are a non-empty prompt of the agent's vocabulary; else InvalidArgumentError."""
        if not ids:
            raise InvalidArgumentError("the prompt is empty")
        vocab = self.backend.vocab_size(agent)
        for i, t in enumerate(ids):  # checked here: a bad id in a shared batch would fail its neighbours too
            if not 0 <= t < vocab:
                raise InvalidArgumentError(
                    f"prompt token {i} is {t}, outside model {agent!r}'s vocabulary [0, {vocab})"
                )
        return ids

    # ------------------------------------------------------------------------------------------ tools
    def tool_parser(self, agent: str) -> ToolParser:
        """The agent's tool-call parser (``gateway.tool_parsers``, else ``gateway.tool_parser``)."""
        return self._parsers.get(agent, self._default_parser)

    async def chat_ids(
        self,
        agent: str,
        messages: ChatMessages,
        tools: Sequence[dict[str, Any]] | None = None,
        episode_id: str = "",
    ) -> list[int]:
        """Token ids of a chat prompt (with the generation prompt) for ``agent``, rendered off the event loop.

        Tools, assistant ``tool_calls`` and ``tool`` results go through the agent's chat template when it renders
        tools (:meth:`InferenceBackend.renders_tools`), else through the fallback format of the agent's tool
        parser (:func:`~services.gateway.core.tools.render.fallback_messages`). A traced prompt that carries back
        a reply this gateway generated in the same episode starts from that reply's exact ids
        (:class:`~services.gateway.core.chat.ChatPrompts`).

        Args:
            agent: The resolved agent.
            messages: Hugging Face chat-template messages (``content`` may be None beside ``tool_calls``).
            tools: OpenAI function tool specs, or None.
            episode_id: The call's episode, or ``""``.

        Raises:
            InvalidArgumentError: Malformed messages, or token ids outside the vocabulary.
        """

        def render() -> list[int]:
            ids = self.chats.render(agent, messages, tools, episode_id)
            return self._checked_ids(agent, [int(t) for t in ids])

        with self.batcher.expecting():  # a lone request queued meanwhile waits for this one
            return await asyncio.to_thread(render)

    def remember_replies(
        self,
        episode_id: str,
        served: Served,
        messages: ChatMessages,
        tools: Sequence[dict[str, Any]] | None,
        replies: Sequence[ChatReply],
    ) -> None:
        """Remember a traced chat call's replies with their exact ids, so the next prompt of its episode that
        carries one back is not re-tokenised (nothing for an untraced call)."""
        self.chats.remember(episode_id, served.agent, messages, tools, replies, served.generations)

    def parse_reply(
        self,
        agent: str,
        generation: Generation,
        tools: Sequence[dict[str, Any]] | None,
        forced: str = "",
        one_call: bool = False,
        call_id: str = "",
    ) -> ChatReply:
        """One generation as an assistant reply: its tool calls parsed by the agent's parser.

        Args:
            agent: The agent that generated it.
            generation: The generation.
            tools: The request's tools, or None when calls must not be parsed (no tools, ``tool_choice: none``).
            forced: The prompt's prefilled start of a call (``tool_choice`` required or named), read as the start
                of the reply.
            one_call: At most one call (``parallel_tool_calls: false``): a reply with more is returned as text.
            call_id: The gateway's id of the generation: the tool calls' ids are derived from it (the same for a
                retry answered from its idempotency key); ``""``: fresh ids.

        Returns:
            The reply; a call that could not be parsed leaves the whole text as content, ``unparsed`` set and
            counted in ``tool_calls_unparsed``.
        """
        if not tools:
            return ChatReply(generation.text, (), generation.finish_reason)
        names = {t["function"]["name"] for t in tools}
        text = forced + generation.text
        parsed = self.tool_parser(agent).parse(text, names)
        if one_call and len(parsed.calls) > 1:
            parsed = Parsed(text, (), unparsed=True)
        if parsed.unparsed:
            self.tool_calls_unparsed += 1
        if not parsed.calls:
            return ChatReply(parsed.content or "", (), generation.finish_reason, parsed.unparsed)
        calls = parsed.calls
        if call_id:
            calls = tuple(dataclasses.replace(c, id=derived_call_id(call_id, k)) for k, c in enumerate(calls))
        return ChatReply(parsed.content, calls, "tool_calls")

    async def generate(
        self,
        model: str,
        prompt: ChatMessages | str | list[int],
        sampling: SamplingParams,
        *,
        n: int = 1,
        episode_id: str = "",
        group_id: str = "",
        idempotency_key: str = "",
        disconnected: Disconnected | None = None,
    ) -> Served:
        """Serve one request: ``n`` samples of the model for one prompt, batched with concurrent requests.

        Retries are recorded once. A traced call whose caller went away before it was answered (``disconnected``
        says so once it is generated, or the caller's task was cancelled: a gRPC deadline or cancel) is not
        recorded (counted in ``unrecorded_disconnected``), so a client that times out and retries trains on one
        call, not two. A retry that names the ``idempotency_key`` of an earlier
        call of the same open episode gets that call's answer (same call ids and generations), without generating
        or recording again; a retry sent while the first is still running waits for it, and then the call is
        recorded even if the first caller went away. A key whose call failed or went unrecorded is free again.
        A call without a key whose caller's task is cancelled while it is still queued is dropped before it
        runs (a keyed one stays queued for its retries); one already running on the engine runs to the end.
        Reusing a key of the episode for a different request (another model, prompt, ``n`` or sampling
        parameter) is refused: keys can only be reused with the same request.

        Args:
            model: ``agent`` or ``agent@VERSION``.
            prompt: Chat messages, raw text, or token ids.
            sampling: Sampling parameters.
            n: Completions to sample, 1..``max_n``; each is one call against ``max_calls_per_episode``.
            episode_id: The client's episode; when set every generation is recorded for training.
            group_id: The client's group (problem id) of the episode.
            idempotency_key: The client's key of this call within ``episode_id`` (HTTP ``Idempotency-Key``, the
                gRPC request's ``idempotency_key``); ignored for untraced calls. Same length and character rules as
                ids.
            disconnected: Asked once the generations are ready; True = nobody receives them.

        Raises:
            NotFoundError: Unknown or non-resident model.
            InvalidArgumentError: Bad ``n``, or ``n`` above ``gateway.max_queue`` (it could never fit); more than ``gateway.max_stop`` stop strings or one longer than
                ``gateway.max_stop_chars`` characters; an episode or group id longer than ``gateway.max_id_chars``
                characters or containing ``/``; an empty prompt, or a prompt plus ``max_tokens`` longer than the
                model accepts (the lengths are named); the episode's call limit (its agent's recorded and running
                calls plus ``n`` above ``gateway.max_calls_per_episode``; nothing is generated then).
            ResourceExhaustedError: The agent's queue or the open-episode limit is full.
            FailedPreconditionError: The episode was already reported, or was abandoned; or ``idempotency_key``
                names an earlier call of the episode whose request differs from this one (HTTP 409).
        """
        for name, value in (
            ("episode_id", episode_id),
            ("group_id", group_id),
            ("idempotency_key", idempotency_key),
        ):
            self._check_id(name, value)
        key = (episode_id, idempotency_key)
        if episode_id and idempotency_key:
            request = fingerprint(model, prompt, sampling, n, group_id)
            if key in self._replays:
                if self._replays[key].fingerprint != request:
                    err = FailedPreconditionError(
                        f"idempotency key {idempotency_key!r} of episode {episode_id!r} was already used for a "
                        "different request (model, prompt, n, sampling parameters or group differ); a key can "
                        "only be reused to retry the same request: use a new key for a new call"
                    )
                    err.param = "idempotency_key"  # type: ignore[attr-defined]  # not a field it lists
                    raise err
                return await self._replay(key)
            # taken before anything is awaited: a duplicate sent at the same moment waits for this call
            call = CallInFlight(fingerprint=request)
            self._replays[key] = call
            call.task = asyncio.ensure_future(
                self._keyed(call, key, model, prompt, sampling, n, group_id, disconnected)
            )
            return await self._await_call(call, keyed=True)
        agent, version, ids = await self._prepare(model, prompt, sampling, n)
        if not episode_id:
            gens = await self.batcher.submit(agent, [ids] * n, sampling, version)
            self.untraced_calls += len(gens)
            return Served([f"call-{uuid.uuid4().hex}" for _ in gens], gens, agent)
        # the call is in flight from here: the episode counts as open and is not abandoned until it returns. It
        # runs as its own task, so a caller that goes away (a cancelled gRPC call) does not stop it: a retry may be
        # waiting for its answer, and otherwise it ends unrecorded.
        self.tracker.begin_call(episode_id, agent, n, group_id)
        call = CallInFlight()
        call.task = asyncio.ensure_future(
            self._traced(call, key, agent, ids, sampling, version, n, group_id, disconnected)
        )
        return await self._await_call(call, keyed=False)

    async def _prepare(
        self, model: str, prompt: ChatMessages | str | list[int], sampling: SamplingParams, n: int
    ) -> tuple[str, int | None, list[int]]:
        """Resolve the model, check ``n`` and the stop strings, and tokenise the prompt (off the event loop).

        Returns:
            ``(agent, version or None, prompt token ids)``.

        Raises:
            As :meth:`generate` (unknown model, bad ``n``, stop limits, a prompt too long for the model).
        """
        agent, version = self.resolve(model)
        if not isinstance(n, int) or not 1 <= n <= self.limits.max_n:
            raise InvalidArgumentError(
                f"n must be an int in [1, {self.limits.max_n}] (gateway.max_n), got {n!r}"
            )
        if n > self.limits.max_queue:  # not overload: no retry could ever be served
            raise InvalidArgumentError(
                f"n is {n}, more than gateway.max_queue ({self.limits.max_queue}), the most prompts an agent may "
                f"have queued or running: this request can never be served; ask for at most "
                f"{self.limits.max_queue} completions per request"
            )
        self._check_stop(sampling)
        if _given_ids(prompt):  # token ids (a chat prompt rendered by chat_ids): checked here, no thread hop
            ids = self.prompt_ids(agent, prompt)
        else:  # off the loop: a long prompt must not block it; a lone request queued meanwhile waits for this one
            with self.batcher.expecting():
                ids = await asyncio.to_thread(self.prompt_ids, agent, prompt)
        limit = self.backend.max_model_len(agent)
        if len(ids) + sampling.max_new_tokens > limit:
            raise InvalidArgumentError(
                f"the prompt has {len(ids)} tokens and max_tokens is {sampling.max_new_tokens}: "
                f"{len(ids) + sampling.max_new_tokens} exceeds model {agent!r}'s context of {limit} tokens"
            )
        return agent, version, ids

    async def _keyed(
        self,
        call: CallInFlight,
        key: tuple[str, str],
        model: str,
        prompt: ChatMessages | str | list[int],
        sampling: SamplingParams,
        n: int,
        group_id: str,
        disconnected: Disconnected | None,
    ) -> Served:
        """A traced call with an idempotency key, whose key was taken before its checks: a check that fails
        frees the key (the duplicates waiting for it get the same error)."""
        try:
            agent, version, ids = await self._prepare(model, prompt, sampling, n)
            self.tracker.begin_call(key[0], agent, n, group_id)
        except BaseException:
            if self._replays.get(key) is call:
                del self._replays[key]
            raise
        return await self._traced(call, key, agent, ids, sampling, version, n, group_id, disconnected)

    async def _await_call(self, call: CallInFlight, *, keyed: bool) -> Served:
        """Wait for a traced call's task on behalf of its first caller. When that caller goes away, the call is
        marked so (it is not recorded unless a retry waits for it), and a call without a key, which no retry can
        wait for, is cancelled (dropped if still queued)."""
        assert call.task is not None
        call.task.add_done_callback(_retrieve)  # its error is the caller's; nobody else may be left to see it
        try:
            return await asyncio.shield(call.task)
        except asyncio.CancelledError:
            call.caller_gone = True
            self.cancelled_calls += 1
            if not keyed:  # no retry can wait for it: still queued, it is dropped before it runs
                call.task.cancel()
            raise

    async def _traced(
        self,
        call: CallInFlight,
        key: tuple[str, str],
        agent: str,
        ids: list[int],
        sampling: SamplingParams,
        version: int | None,
        n: int,
        group_id: str,
        disconnected: Disconnected | None,
    ) -> Served:
        """Generate a traced call begun with ``begin_call`` and record it, unless its caller went away and no
        retry waits for it; an idempotency key stays taken only by a recorded call (until its episode closes)."""
        episode_id, idempotency_key = key
        recorded = False
        try:
            try:
                gens = await self.batcher.submit(agent, [ids] * n, sampling, version)
            except asyncio.CancelledError:  # its caller went away and no retry can wait for it
                self.unrecorded_disconnected += 1
                _LOG.info("a call of episode %r is not recorded: its caller went away", episode_id)
                raise
            served = Served([f"call-{uuid.uuid4().hex}" for _ in gens], gens, agent)
            gone = call.caller_gone or (disconnected is not None and await disconnected())
            if gone and call.waiters == 0:
                self.unrecorded_disconnected += 1
                _LOG.info("a call of episode %r is not recorded: its caller went away", episode_id)
            else:
                for cid, g in zip(served.call_ids, gens, strict=True):
                    self.tracker.record(episode_id, agent, cid, g, group_id)
                recorded = True
            return served
        finally:
            self.tracker.end_call(episode_id, agent, n)
            if idempotency_key:
                if recorded:  # retries get this answer while the episode is open
                    self.tracker.on_close(episode_id, lambda: self._replays.pop(key, None))
                elif self._replays.get(key) is call:  # failed or unrecorded: the key is free again
                    del self._replays[key]

    async def _replay(self, key: tuple[str, str]) -> Served:
        """The answer of the call recorded (or running) under ``key``; counts ``replayed_calls``. A retry that
        waits for a running call gets its error when it fails."""
        call = self._replays[key]
        call.waiters += 1
        try:
            served = await asyncio.shield(call.task)
        finally:
            call.waiters -= 1
        self.replayed_calls += 1
        return served

    def _check_stop(self, sampling: SamplingParams) -> None:
        """Raises InvalidArgumentError for more than ``max_stop`` stop strings or one over ``max_stop_chars``."""
        stop = sampling.stop
        if len(stop) > self.limits.max_stop:
            raise InvalidArgumentError(
                f"the request has {len(stop)} stop strings; the limit (gateway.max_stop) is {self.limits.max_stop}"
            )
        for i, s in enumerate(stop):
            if len(s) > self.limits.max_stop_chars:
                raise InvalidArgumentError(
                    f"stop string {i} has {len(s)} characters; the limit (gateway.max_stop_chars) is "
                    f"{self.limits.max_stop_chars}"
                )

    def _check_id(self, name: str, value: str) -> None:
        """Raises InvalidArgumentError for an id (episode, group, idempotency key) over ``max_id_chars``, or
        containing ``/`` or a control character (NUL, newline, ...: they would corrupt logs and paths)."""
        if len(value) > self.limits.max_id_chars:
            raise InvalidArgumentError(
                f"{name} has {len(value)} characters; the limit (gateway.max_id_chars) is {self.limits.max_id_chars}"
            )
        if "/" in value:
            raise InvalidArgumentError(f"{name} {value!r} contains '/', which ids may not contain")
        bad = next((c for c in value if unicodedata.category(c) == "Cc"), None)
        if bad is not None:
            raise InvalidArgumentError(
                f"{name} {value!r} contains the control character U+{ord(bad):04X}, which ids may not contain"
            )

    # ------------------------------------------------------------------------------------------ rewards
    async def report(
        self,
        episode_id: str,
        rewards: dict[str, float],
        *,
        call_rewards: dict[str, float] | None = None,
        group_id: str = "",
        group_size: int = 0,
        failed: bool = False,
    ) -> Reported:
        """End an episode (see :meth:`EpisodeTracker.finish`) and hand released episodes to the sink.

        Every released episode is offered to the sink, even after one fails, and even if the caller goes away
        meanwhile; ``released`` counts those inserted, ``sink_errors`` those that failed (they are lost to
        training). The report waits at most ``gateway.report_wait_s`` seconds for the inserts; episodes not
        inserted by then stay in the backlog (inserted in the background, in report order; the gateway keeps the
        task) and the answer says how many (:attr:`Reported.queued`; ``queued_reports`` counts such answers).
        Errors of inserts that finish after the answer are counted in ``sink_errors`` and logged.

        The report is validated (as :meth:`EpisodeTracker.finish`) before the backlog is checked, so an invalid
        report gets its own error even while the backlog is full; a report that releases nothing (a failed one,
        a member that leaves its group incomplete) is never refused for the backlog.

        Raises:
            InvalidArgumentError: An empty episode id, an episode or group id longer than
                ``gateway.max_id_chars`` characters or containing ``/``; or as :meth:`EpisodeTracker.finish`.
            ResourceExhaustedError: The episodes this report would release do not fit in the backlog:
                ``gateway.max_backlog_episodes`` minus those still waiting to be inserted (the trainer is
                behind). A group larger than the limit is taken only while the backlog is empty. Refused before
                anything changes: the episode stays open and a later report of it can succeed. Counted in
                ``backlog_refused``.
            UnavailableError: The gateway is closing: before the report was taken (nothing changed), or after
                (some of its released episodes were not inserted because the gateway closed; they are lost to
                training, counted in ``backlog_lost_at_close``, and the message names them).
            NotFoundError / FailedPreconditionError: as :meth:`EpisodeTracker.finish`.
            AbortedError: The sink failed with a marti error within ``gateway.report_wait_s``: the report was
                taken but the named episodes were not inserted and are lost to training (``sink_errors``); the
                message names the sink's error and says not to report them again (a retry is refused as already
                reported).
            The sink's own exception, when it is not a marti error (an HTTP 500 that hides its text).
        """
        if not episode_id:
            raise InvalidArgumentError("episode_id must be a non-empty string")
        self._check_id("episode_id", episode_id)
        self._check_id("group_id", group_id)
        if self.closing.is_set():
            raise UnavailableError("the gateway is shutting down: the report was not taken")
        own = {} if failed else self.tracker.turn_versions(episode_id)
        released = self.tracker.finish(
            episode_id,
            rewards,
            call_rewards=call_rewards,
            group_id=group_id,
            group_size=group_size,
            failed=failed,
            admit=(lambda coming: self.delivery.admit(episode_id, coming)) if self.sink is not None else None,
        )
        out = Reported(released.episodes, released.dropped, stale=self._stale(episode_id, own, released))
        if released.episodes:
            out.queued = await self.delivery.deliver(episode_id, released.episodes)
        return out

    def _stale(self, episode_id: str, own: dict[str, list[int]], released: Released) -> list[StaleCalls]:
        """The calls past their agent's bound among the released episodes and the reported one (``own``: its
        agents' turn versions, read before the report; it may be held for its group); counts and logs them."""
        if not self.max_staleness or released.dropped:
            return []
        episodes = {
            next(iter(ep.values())).episode_id: {
                a: [t.policy_version or 0 for t in tr.turns] for a, tr in ep.items()
            }
            for ep in released.episodes
            if ep
        }
        episodes.setdefault(episode_id, own)
        current = self.backend.versions()
        out = []
        for eid, agents in episodes.items():
            for agent, versions in agents.items():
                bound = self.max_staleness.get(agent)
                old = [v for v in versions if bound is not None and current[agent] - v > bound]
                if old:
                    out.append(StaleCalls(eid, agent, min(old), current[agent], bound, len(old)))  # type: ignore[arg-type]
        if out:
            self.stale_reported += len({s.episode_id for s in out})
            _LOG.warning(
                "report of episode %r: calls already past the staleness bound, so training will drop them: %s",
                episode_id,
                [f"{s.episode_id}/{s.agent}: v{s.policy_version} is more than {s.max_staleness} behind "
                 f"v{s.current_version}" for s in out],
            )  # fmt: skip
        return out

    def stats(self) -> dict[str, float]:
        """Counters: ``calls`` (traced), ``untraced_calls``, ``finished``, ``released`` (inserted into the sink;
        without a sink, every released episode), ``abandoned``, ``failed``, ``dropped``, ``expired_groups``,
        ``held`` (finished episodes waiting for their group), ``open_episodes``, ``batches``, ``batched_prompts``,
        ``lone_batches`` (batches started at once: the engine idle, nothing else queued or on its way), the serving
        loop's lag over its last minute (``loop_lag_ms_p50``, ``loop_lag_ms_p99``, ``loop_lag_ms_max``,
        ``loop_lag_samples``: :class:`~services.gateway.core.loop_lag.LoopLagProbe`, 0 before :meth:`start`),
        ``sink_errors`` (released episodes the sink failed to insert), ``stale_reported`` (episodes a report named
        as already past the staleness bound, see :attr:`Reported.stale`), ``unrecorded_disconnected`` (traced calls
        not recorded because their caller went away), ``cancelled_calls`` (traced calls whose caller's task was
        cancelled while they ran: a gRPC deadline or cancel, an HTTP client that disconnected), ``replayed_calls``
        (retries answered from an idempotency key), ``backlog`` (released episodes waiting to be inserted now), ``queued_reports`` (reports
        answered before their episodes were inserted), ``backlog_refused`` (reports refused because the backlog
        was full), ``backlog_lost_at_close`` (backlog episodes never inserted because the gateway closed),
        ``held_lost_at_close`` (finished episodes still held for their incomplete group when the gateway closed),
        ``open_lost_at_close`` (episodes not reported yet when the gateway closed); the last two are 0 until
        :meth:`close`; ``tool_calls_unparsed`` (replies that tried a tool call that could not be parsed, returned
        as text); ``prompts_spliced`` (traced chat prompts that started from an earlier reply's exact ids) and
        ``prompts_retokenized`` (ones that carried such a reply back but were rendered whole, see
        :mod:`services.gateway.core.chat`)."""
        out = {k: float(v) for k, v in self.tracker.counters.items()}
        out.update(self.delivery.stats())
        out["held"] = float(self.tracker.held)
        out["untraced_calls"] = float(self.untraced_calls)
        out["open_episodes"] = float(self.tracker.open_episodes)
        out["batches"] = float(self.batcher.batches)
        out["batched_prompts"] = float(self.batcher.prompts)
        out["lone_batches"] = float(self.batcher.lone_batches)
        out.update(self.loop_lag.stats())
        out["stale_reported"] = float(self.stale_reported)
        out["unrecorded_disconnected"] = float(self.unrecorded_disconnected)
        out["cancelled_calls"] = float(self.cancelled_calls)
        out["replayed_calls"] = float(self.replayed_calls)
        out["held_lost_at_close"] = float(self.held_lost_at_close)
        out["open_lost_at_close"] = float(self.open_lost_at_close)
        out["tool_calls_unparsed"] = float(self.tool_calls_unparsed)
        out["prompts_spliced"] = float(self.chats.spliced)
        out["prompts_retokenized"] = float(self.chats.retokenized)
        return out
