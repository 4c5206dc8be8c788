"""The gateway facade: resolve a model name, batch the call into the engine, record its trace, take rewards.

Both adapters (OpenAI-compatible HTTP in ``http_app.py``, gRPC in ``servicer.py``) call only this class, so the
two protocols behave the same and raise the same :mod:`marti.errors` types (mapped to HTTP codes in one place,
to gRPC status codes by the shared interceptor).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from marti.errors import InvalidArgumentError, NotFoundError
from marti.inference import ChatMessages, Generation, SamplingParams
from marti.trajectory import Trajectory
from services.gateway.core.backend import InferenceBackend
from services.gateway.core.batcher import RequestBatcher
from services.gateway.core.limits import GatewayLimits
from services.gateway.core.traces import EpisodeTracker, Released

_LOG = logging.getLogger("marti.gateway")

#: Receives each released episode (agent -> trajectory); blocking, called from a worker thread.
EpisodeSink = Callable[[dict[str, Trajectory]], None]


@dataclass(frozen=True)
class ModelCard:
    """One servable model name.

    Attributes:
        id: ``agent`` (the current policy) or ``agent@VERSION`` (a resident version).
        agent: The agent.  version: Its policy version now (for ``agent``) or the pinned one.
        pinned: True for ``agent@VERSION`` names.
    """

    id: str
    agent: str
    version: int
    pinned: bool


@dataclass
class Served:
    """What one request got.

    Attributes:
        call_ids: One id per generation (per-call rewards name it).
        generations: ``n`` generations, each with its exact token ids, log-probs and policy version.
        agent: The agent that served it.
    """

    call_ids: list[str]
    generations: list[Generation]
    agent: str


class Gateway:
    """Serves every agent's policy, batched, and turns finished external episodes into training data.

    Args:
        backend: The policies.
        limits: Batching and limits.
        sink: Where released episodes go (the job's store tables); None = traces are kept only in counters.
        trainable: Agents whose traces become training data (default: every served agent).
    """

    def __init__(
        self,
        backend: InferenceBackend,
        limits: GatewayLimits | None = None,
        sink: EpisodeSink | None = None,
        trainable: Sequence[str] | None = None,
    ) -> None:
        self.backend = backend
        self.limits = limits or GatewayLimits()
        self.sink = sink
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
        )
        self._sweeper: asyncio.Task[None] | None = None
        self._sink_lock = asyncio.Lock()
        self.untraced_calls = 0
        self.sink_errors = 0

    # ------------------------------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Start the sweeper that abandons silent episodes (call on the serving loop)."""
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())

    async def close(self) -> None:
        """Stop the sweeper and the batcher (queued requests fail with RESOURCE_EXHAUSTED)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        await self.batcher.close()

    async def _sweep_forever(self) -> None:
        period = min(1.0, self.limits.episode_timeout_s / 4)
        while True:
            await asyncio.sleep(period)
            dropped = self.tracker.sweep().dropped
            if dropped:
                _LOG.warning("dropped %d abandoned external episodes (with their groups)", dropped)

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
            NotFoundError: No such agent, a malformed version, or a version that is not resident (the
                resident ones are named).
        """
        agent, sep, ver = model.partition("@")
        agents = self.backend.agents()
        if agent not in agents:
            raise NotFoundError(f"model {model!r} does not exist; this gateway serves {agents}")
        if not sep:
            return agent, None
        resident = self.backend.resident_versions(agent)
        if not ver.isdigit() or int(ver) not in resident:
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
        if not ids:
            raise InvalidArgumentError("the prompt is empty")
        vocab = self.backend.vocab_size(agent)
        for i, t in enumerate(ids):  # checked here: a bad id in a shared batch would fail its neighbours too
            if not 0 <= t < vocab:
                raise InvalidArgumentError(
                    f"prompt token {i} is {t}, outside model {agent!r}'s vocabulary [0, {vocab})"
                )
        return ids

    async def generate(
        self,
        model: str,
        prompt: ChatMessages | str | list[int],
        sampling: SamplingParams,
        *,
        n: int = 1,
        episode_id: str = "",
        group_id: str = "",
    ) -> Served:
        """Serve one request: ``n`` samples of the model for one prompt, batched with concurrent requests.

        Args:
            model: ``agent`` or ``agent@VERSION``.
            prompt: Chat messages, raw text, or token ids.
            sampling: Sampling parameters.
            n: Completions to sample, 1..``max_n``.
            episode_id: The client's episode; when set every generation is recorded for training.
            group_id: The client's group (problem id) of the episode.

        Raises:
            NotFoundError: Unknown or non-resident model.
            InvalidArgumentError: Bad ``n``, an empty prompt, or a prompt plus ``max_tokens`` longer than the
                model accepts (the lengths are named); the episode's call limit.
            ResourceExhaustedError: The agent's queue or the open-episode limit is full.
            FailedPreconditionError: The episode was already reported.
        """
        agent, version = self.resolve(model)
        if not isinstance(n, int) or not 1 <= n <= self.limits.max_n:
            raise InvalidArgumentError(
                f"n must be an int in [1, {self.limits.max_n}] (gateway.max_n), got {n!r}"
            )
        ids = self.prompt_ids(agent, prompt)
        limit = self.backend.max_model_len(agent)
        if len(ids) + sampling.max_new_tokens > limit:
            raise InvalidArgumentError(
                f"the prompt has {len(ids)} tokens and max_tokens is {sampling.max_new_tokens}: "
                f"{len(ids) + sampling.max_new_tokens} exceeds model {agent!r}'s context of {limit} tokens"
            )
        if episode_id:
            self.tracker.check_can_record(episode_id, agent)
        gens = await self.batcher.submit(agent, [ids] * n, sampling, version)
        call_ids = [f"call-{uuid.uuid4().hex}" for _ in gens]
        if episode_id:
            for cid, g in zip(call_ids, gens, strict=True):
                self.tracker.record(episode_id, agent, cid, g, group_id)
        else:
            self.untraced_calls += len(gens)
        return Served(call_ids, gens, agent)

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
    ) -> Released:
        """End an episode (see :meth:`EpisodeTracker.finish`) and hand released episodes to the sink.

        Raises:
            InvalidArgumentError / FailedPreconditionError: as :meth:`EpisodeTracker.finish`.
            Whatever the sink raises (the episode is then lost to training and ``sink_errors`` counts it; the
            caller gets the error).
        """
        if not episode_id:
            raise InvalidArgumentError("episode_id must be a non-empty string")
        released = self.tracker.finish(
            episode_id,
            rewards,
            call_rewards=call_rewards,
            group_id=group_id,
            group_size=group_size,
            failed=failed,
        )
        if self.sink is not None and released.episodes:
            async with self._sink_lock:  # one episode's items stay adjacent in every table
                for ep in released.episodes:
                    try:
                        await asyncio.to_thread(self.sink, ep)
                    except BaseException:
                        self.sink_errors += 1
                        raise
        return released

    def stats(self) -> dict[str, float]:
        """Counters: ``calls`` (traced), ``untraced_calls``, ``finished``, ``released``, ``abandoned``,
        ``failed``, ``dropped``, ``open_episodes``, ``batches``, ``batched_prompts``, ``sink_errors``."""
        out = {k: float(v) for k, v in self.tracker.counters.items()}
        out["untraced_calls"] = float(self.untraced_calls)
        out["open_episodes"] = float(self.tracker.open_episodes)
        out["batches"] = float(self.batcher.batches)
        out["batched_prompts"] = float(self.batcher.prompts)
        out["sink_errors"] = float(self.sink_errors)
        return out
