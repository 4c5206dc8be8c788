"""Several rollout engines behind one (``vllm.num_engines``): each generate call is split among them.

OpenRLHF's ``--vllm_num_engines N`` starts N vLLM engines and spreads the prompts over them. Here
:func:`services.trainer.rollout.engines.generation.build_rollout_engine` builds ``vllm.num_engines`` vLLM engines (each of
``vllm.tensor_parallel_size`` GPUs, seeded ``seed + i``) and wraps them in an :class:`EnginePool`: a call's B
prompts are cut into contiguous chunks, engine ``i`` generating chunk ``i`` (:func:`split_contiguous`), the chunks
running concurrently in threads and the generations joined back in prompt order. Weight updates and sampling
defaults go to every engine, so all of them always sample with the same policy version.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

from marti.errors import InvalidArgumentError
from services.trainer.rollout.engines.base import Generation, Prompt, RolloutEngine, SamplingParams, shifted

__all__ = ["EnginePool", "split_contiguous"]


def split_contiguous(count: int, parts: int) -> list[tuple[int, int]]:
    """Cut ``range(count)`` into ``parts`` contiguous ``[lo, hi)`` chunks whose sizes differ by at most one.

    Chunk ``i`` is ``[count * i // parts, count * (i + 1) // parts)``; with fewer items than parts some chunks
    are empty. Example: ``split_contiguous(5, 2) == [(0, 2), (2, 5)]``.

    Raises:
        InvalidArgumentError: ``count < 0`` or ``parts < 1``.
    """
    if count < 0 or parts < 1:
        raise InvalidArgumentError(
            f"cannot split {count} items into {parts} parts (need count >= 0, parts >= 1)"
        )
    bounds = [count * i // parts for i in range(parts + 1)]
    return list(zip(bounds, bounds[1:], strict=False))


class EnginePool(RolloutEngine):
    """N rollout engines serving the same agents, used as one.

    Args:
        engines: The engines, at least one, each serving the same agent ids (in any order).

    Raises:
        InvalidArgumentError: no engine, or the engines serve different agents.
    """

    def __init__(self, engines: Sequence[RolloutEngine]) -> None:
        engines = list(engines)
        if not engines:
            raise InvalidArgumentError("an engine pool needs at least one engine, got none")
        agents = engines[0].agent_ids
        for i, e in enumerate(engines[1:], start=1):
            if sorted(e.agent_ids) != sorted(agents):
                raise InvalidArgumentError(f"engine {i} serves {e.agent_ids}, engine 0 serves {agents}")
        super().__init__(agents, {a: engines[0].sampling_for(a) for a in agents})
        self.engines = engines
        self.last_split: list[int] = []
        """Prompts each engine got in the last :meth:`generate` call (for metrics and tests)."""

    def set_sampling(self, agent_id: str, params: SamplingParams) -> None:
        """Set the agent's default sampling parameters on every engine."""
        super().set_sampling(agent_id, params)
        for e in self.engines:
            e.set_sampling(agent_id, params)

    def policy_version(self, agent_id: str) -> int:
        """The agent's weight version (every engine holds the same one)."""
        return self.engines[0].policy_version(agent_id)

    def max_model_len(self, agent_id: str) -> int:
        """Most prompt-plus-response tokens the engines accept for the agent (the smallest of them)."""
        limits = []
        for e in self.engines:
            limit = getattr(e, "max_model_len", None)
            limits.append(int(limit(agent_id) if callable(limit) else limit))
        return min(limits)

    def generate(
        self, agent_id: str, prompts: Sequence[Prompt], sampling: SamplingParams | None = None
    ) -> list[Generation]:
        """See :meth:`RolloutEngine.generate`: the prompts are split contiguously among the engines
        (:func:`split_contiguous`), generated concurrently, and returned in prompt order. A too-long prompt's
        error names its position in this call (not in its engine's chunk)."""
        self._check_agent(agent_id)
        prompts = list(prompts)
        chunks = split_contiguous(len(prompts), len(self.engines))
        self.last_split = [hi - lo for lo, hi in chunks]
        work = [(e, lo, prompts[lo:hi]) for e, (lo, hi) in zip(self.engines, chunks, strict=True) if hi > lo]

        def run(engine: RolloutEngine, lo: int, chunk: list[Prompt]) -> list[Generation]:
            try:
                return engine.generate(agent_id, chunk, sampling)
            except InvalidArgumentError as exc:  # a too-long prompt: its position in the whole call
                raise shifted(exc, lo) from None

        if len(work) <= 1:
            parts = [run(*w) for w in work]
        else:
            with ThreadPoolExecutor(max_workers=len(work)) as pool:
                futures = [pool.submit(run, *w) for w in work]
                parts = [f.result() for f in futures]
        return [g for part in parts for g in part]

    def update_weights(self, agent_id: str, weights: Mapping[str, torch.Tensor], policy_version: int) -> None:
        """See :meth:`RolloutEngine.update_weights`: every engine loads the weights under the version."""
        self._check_version(agent_id, policy_version)
        for e in self.engines:
            e.update_weights(agent_id, weights, policy_version)
        for a in self._agent_ids:  # agents sharing the model got the version too
            self._versions[a] = self.engines[0].policy_version(a)
