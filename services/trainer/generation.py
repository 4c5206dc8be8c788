"""What every actor that samples turns shares: its rollout engine and how a turn's prompt is built.

The policy actor (:class:`~services.trainer.worker.PolicyWorker`) and the rollout actors
(:class:`~services.trainer.rollout_worker.RolloutWorker`) both build their engine with
:func:`build_rollout_engine` and sample with :func:`generate_turns`, so a turn is the same wherever it is
generated.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import torch

from marti.config import TrainConfig
from services.trainer.rollout import vllm_available
from services.trainer.rollout.base import Generation, RolloutEngine, SamplingParams, chat_to_ids


def sampling_params(cfg: TrainConfig, agent: str, greedy: bool = False) -> SamplingParams:
    """The agent's sampling parameters (its overrides on the ``rollout`` defaults); ``greedy`` keeps only its
    ``max_new_tokens`` and decodes with temperature 0 (evaluation)."""
    s = cfg.sampling_for(agent)
    if greedy:
        return SamplingParams(max_new_tokens=s.max_new_tokens, temperature=0.0)
    return SamplingParams(max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p)


def build_rollout_engine(
    cfg: TrainConfig,
    policy: Any,
    agents: list[str],
    device: str,
    *,
    copy_weights: bool,
    engine: str | None = None,
) -> RolloutEngine:
    """The rollout engine of ``rollout.engine`` over a policy's agents.

    ``auto`` picks vLLM on CUDA when it is installed, else transformers ``generate``.

    Args:
        cfg: The training config (``rollout``, ``vllm``, per-agent sampling).
        policy: The :class:`~services.trainer.policy.MultiAgentPolicy` whose models the engine serves.
        agents: The agents it serves (default sampling parameters are set for them).
        device: ``cpu`` or ``cuda``.
        copy_weights: Transformers engine only: sample from deep copies synced by ``update_weights`` (True) or
            from the policy's live modules (False). vLLM always holds its own weights, loaded from the policy
            at once (version 0 or the policy's current version).
        engine: ``hf``, ``vllm`` or ``auto``; None = ``rollout.engine``.

    Raises:
        InvalidArgumentError: An invalid engine setting (named).
    """
    sampling = {a: sampling_params(cfg, a) for a in agents}
    engine = engine or cfg.rollout.engine
    if engine == "auto":
        engine = "vllm" if device == "cuda" and vllm_available() else "hf"
    if engine == "vllm":
        from services.trainer.rollout.vllm_engine import VLLMRolloutEngine

        vllm_engine = VLLMRolloutEngine.from_policy(policy, cfg.vllm, agents, default_sampling=sampling)
        for agent in agents:  # the policy's exact weights (tiny models are seeded, adapters random)
            vllm_engine.update_weights(agent, policy.state_for_sync(agent), policy.version(agent))
        return vllm_engine
    from services.trainer.rollout.hf import HFRolloutEngine

    return HFRolloutEngine.from_policy(policy, copy_weights=copy_weights, default_sampling=sampling)


def generate_turns(
    cfg: TrainConfig,
    policy: Any,
    engine: RolloutEngine,
    lock: threading.Lock,
    agent_id: str,
    chats: list[list[dict[str, str]]],
    greedy: bool = False,
) -> list[Generation]:
    """Generate one response per chat prompt with the agent's sampling parameters.

    When the agent has a ``response_prefix``, the prompt is the chat template's output followed by the prefix
    tokens, and each generation's ``text`` starts with the prefix (its token ids stay in the prompt, so the
    prefix is never trained).

    Args:
        cfg: The training config.
        policy: The policy the engine serves (its tokenizers).
        engine: The rollout engine.
        lock: Held around the engine call; weight syncs take it too (engines are not thread-safe).
        agent_id: The agent.
        chats: B chat conversations (system + user messages).
        greedy: Decode greedily (evaluation) instead of sampling.

    Returns:
        B :class:`~services.trainer.rollout.base.Generation` objects (token ids, logprobs, text, version).

    Raises:
        NotFoundError: Unknown agent.
        InvalidArgumentError: A prompt plus ``max_new_tokens`` beyond the model's length.
    """
    sampling = sampling_params(cfg, agent_id, greedy)
    prefix = cfg.agent(agent_id).response_prefix
    prompts: list[Any] = chats
    if prefix:
        tok = policy.tokenizer(agent_id)
        prefix_ids = tok(prefix, add_special_tokens=False)["input_ids"]
        prompts = [chat_to_ids(tok, chat) + list(prefix_ids) for chat in chats]
    with lock, torch.no_grad():
        gens = engine.generate(agent_id, prompts, sampling)
    if prefix:
        gens = [dataclasses.replace(g, text=prefix + g.text) for g in gens]
    return gens
