"""What every actor that samples turns shares: its rollout engine and how a turn's prompt is built.

The policy actor (:class:`~services.trainer.ray.policy_worker.PolicyWorker`) and the rollout actors
(:class:`~services.trainer.ray.rollout_worker.RolloutWorker`) both build their engine with
:func:`build_rollout_engine` and sample with :func:`generate_turns`, so a turn is the same wherever it is
generated. Inference-gateway calls go through :func:`serve_generations` instead: the caller's sampling
parameters, and optionally an older policy version kept in :class:`ResidentWeights`.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from marti.config import TrainConfig
from marti.config.sections.rollout import VllmConfig
from marti.errors import AbortedError, InvalidArgumentError, NotFoundError
from services.trainer.rollout import vllm_available
from services.trainer.rollout.engines.base import Generation, RolloutEngine, SamplingParams, chat_to_ids
from services.trainer.rollout.engines.precision import resolve_rollout_dtype


def sampling_params(cfg: TrainConfig, agent: str, greedy: bool = False) -> SamplingParams:
    """The agent's sampling parameters (its overrides on the ``rollout`` defaults); ``greedy`` keeps only its
    ``max_new_tokens`` and decodes with temperature 0 (evaluation)."""
    s = cfg.sampling_for(agent)
    sampled = SamplingParams(max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p)
    return _greedy(sampled) if greedy else sampled


def _greedy(sampling: SamplingParams) -> SamplingParams:
    """Greedy decoding (evaluation) within ``sampling``'s ``max_new_tokens``."""
    return SamplingParams(max_new_tokens=sampling.max_new_tokens, temperature=0.0)


@dataclasses.dataclass(frozen=True)
class GenerationConfig:
    """What sampling turns takes from the training config, built on the driver by :func:`generation_config`
    (part of a sampling actor's narrow config).

    Attributes:
        engine: ``rollout.engine``: ``auto``, ``hf``, ``hf_static`` or ``vllm``.
        vllm: The ``vllm`` section (frozen).
        dtype: ``rollout.dtype``: None, ``auto``, ``float32`` or ``bfloat16`` (the transformers engines' sampling dtype,
            resolved on the actor's device by :func:`~services.trainer.rollout.engines.precision.resolve_rollout_dtype`).
        sampling: Per agent, its sampling parameters (:func:`sampling_params`).
        response_prefixes: Per agent, its ``response_prefix`` (``""``: none).
        merge_adapters: ``rollout.merge_adapters``: the transformers engines' ``merge_adapters`` (most adapters of
            one LoRA base sampled from merged copies).
    """

    engine: str
    vllm: VllmConfig
    dtype: str | None
    sampling: dict[str, SamplingParams]
    response_prefixes: dict[str, str]
    merge_adapters: int = 1

    def params(self, agent: str, greedy: bool = False) -> SamplingParams:
        """The agent's sampling parameters; ``greedy``: decode with temperature 0 within its ``max_new_tokens``.

        Raises:
            InvalidArgumentError: No agent has that name (the message lists the agents).
        """
        if agent not in self.sampling:
            raise InvalidArgumentError(f"no agent {agent!r}; agents are {list(self.sampling)}")
        return _greedy(self.sampling[agent]) if greedy else self.sampling[agent]


def generation_config(cfg: TrainConfig) -> GenerationConfig:
    """The :class:`GenerationConfig` of a training config (every agent's sampling and response prefix)."""
    return GenerationConfig(
        engine=cfg.rollout.engine,
        vllm=cfg.vllm,
        dtype=cfg.rollout.dtype,
        sampling={a.name: sampling_params(cfg, a.name) for a in cfg.agents},
        response_prefixes={a.name: a.response_prefix or "" for a in cfg.agents},
        merge_adapters=cfg.rollout.merge_adapters,
    )


def engine_count(cfg: TrainConfig | GenerationConfig, engine: str) -> int:
    """How many engines :func:`build_rollout_engine` builds for the resolved engine name (``hf`` or ``vllm``):
    ``vllm.num_engines`` for vLLM, 1 for transformers."""
    return cfg.vllm.num_engines if engine == "vllm" else 1


def resolve_auto_engine(device: str) -> str:
    """What ``rollout.engine: auto`` builds on ``device``: the fastest engine measured there that is correct.

    On the CPU ``hf_static`` (its own decode loop, sampler and, for Llama-family models, lean forward: 1.52x,
    1.68x and 1.57x ``hf``'s tokens/s at batches 1, 8 and 64 in bf16 on 2026-12-07; 1.04-1.05x, 1.16-1.26x and
    1.20-1.26x in two runs before the lean forward; docs/benchmarks.md "Rollout engines"); on CUDA vLLM when it is
    installed, else ``hf`` (``hf_static``'s compiled CUDA path has not run on a GPU yet).

    Args:
        device: ``cpu`` or ``cuda``.

    Returns:
        ``hf_static``, ``vllm`` or ``hf``.
    """
    if device != "cuda":
        return "hf_static"
    return "vllm" if vllm_available() else "hf"


def resolved_rollout(cfg: GenerationConfig, device: str) -> dict[str, str]:
    """What the job's sampling engines are on ``device``: ``rollout.engine`` and ``rollout.dtype`` resolved as
    :func:`build_rollout_engine` resolves them.

    Returns:
        ``{"engine": "hf" | "hf_static" | "vllm", "dtype": "float32" | "bfloat16" | "policy" | "vllm"}``: ``policy``
        samples in the policy's own dtype (no copy), ``vllm`` in vLLM's own.

    Raises:
        InvalidArgumentError: An invalid ``rollout.dtype`` (named).
    """
    engine = resolve_auto_engine(device) if cfg.engine == "auto" else cfg.engine
    if engine == "vllm":
        return {"engine": engine, "dtype": "vllm"}
    dtype = resolve_rollout_dtype(cfg.dtype, device)
    return {"engine": engine, "dtype": "policy" if dtype is None else str(dtype).removeprefix("torch.")}


def build_rollout_engine(
    cfg: GenerationConfig,
    policy: Any,
    agents: list[str],
    device: str,
    *,
    copy_weights: bool,
    engine: str | None = None,
) -> RolloutEngine:
    """The rollout engine of ``rollout.engine`` over a policy's agents.

    ``auto`` is :func:`resolve_auto_engine`: ``hf_static`` on the CPU; vLLM on CUDA when it is installed, else
    transformers ``generate``. ``hf_static`` is the
    transformers engine with its own decode loop (:class:`~services.trainer.rollout.engines.static.StaticCacheRolloutEngine`:
    a preallocated cache; compiled decode steps with CUDA graphs on CUDA). With vLLM,
    ``vllm.num_engines`` engines are built (engine ``i`` seeded ``seed + i``) and, when there are several,
    wrapped in an :class:`~services.trainer.rollout.engines.pool.EnginePool` that splits every call's prompts among them.
    The transformers engines sample in ``rollout.dtype`` resolved on ``device`` (bf16 copies of the weights on a
    CPU with native bf16 under ``auto``; the policy's own weights when null;
    :mod:`services.trainer.rollout.engines.precision`).

    Args:
        cfg: The sampling part of the training config (:func:`generation_config`: ``rollout.engine``,
            ``vllm``, per-agent sampling).
        policy: The :class:`~services.trainer.models.policy.MultiAgentPolicy` whose models the engine serves.
        agents: The agents it serves (default sampling parameters are set for them).
        device: ``cpu`` or ``cuda``.
        copy_weights: Transformers engine only: sample from deep copies synced by ``update_weights`` (True) or
            from the policy's live modules (False). vLLM always holds its own weights, loaded from the policy
            at once (version 0 or the policy's current version).
        engine: ``hf``, ``hf_static``, ``vllm`` or ``auto``; None = ``rollout.engine``.

    Raises:
        InvalidArgumentError: An invalid engine setting (named), or an explicit ``rollout.dtype`` with vLLM (whose
            dtype is its own).
    """
    sampling = {a: cfg.params(a) for a in agents}
    engine = engine or cfg.engine
    if engine == "auto":
        engine = resolve_auto_engine(device)
    dtype = resolve_rollout_dtype(cfg.dtype, device)
    if engine == "vllm":
        if cfg.dtype not in (None, "auto"):
            raise InvalidArgumentError(
                f"rollout.dtype={cfg.dtype} applies to the transformers engines; vLLM samples in its own dtype "
                "(leave rollout.dtype null or auto)"
            )
        from services.trainer.rollout.engines.pool import EnginePool
        from services.trainer.rollout.engines.vllm_engine import VLLMRolloutEngine

        engines = []
        for i in range(engine_count(cfg, engine)):  # vllm.num_engines: each call's prompts split among them
            vllm_engine = VLLMRolloutEngine.from_policy(
                policy, cfg.vllm, agents, default_sampling=sampling, seed_offset=i
            )
            for agent in agents:  # the policy's exact weights (tiny models are seeded, adapters random)
                vllm_engine.update_weights(agent, policy.state_for_sync(agent), policy.version(agent))
            engines.append(vllm_engine)
        return engines[0] if len(engines) == 1 else EnginePool(engines)
    if engine == "hf_static":
        from services.trainer.rollout.engines.static import StaticCacheRolloutEngine

        return StaticCacheRolloutEngine.from_policy(
            policy,
            copy_weights=copy_weights,
            default_sampling=sampling,
            compile=None,
            dtype=dtype,
            merge_adapters=cfg.merge_adapters,
        )
    from services.trainer.rollout.engines.hf import HFRolloutEngine

    return HFRolloutEngine.from_policy(
        policy,
        copy_weights=copy_weights,
        default_sampling=sampling,
        dtype=dtype,
        merge_adapters=cfg.merge_adapters,
    )


def generate_turns(
    cfg: GenerationConfig,
    policy: Any,
    engine: RolloutEngine,
    lock: threading.Lock,
    agent_id: str,
    chats: list[list[dict[str, str]]],
    greedy: bool = False,
    reply_starts: Sequence[str] | None = None,
) -> list[Generation]:
    """Generate one response per chat prompt with the agent's sampling parameters.

    A row's reply is prefilled with the agent's ``response_prefix`` followed by its reply start (``reply_starts``,
    a workflow role's :class:`marti.team.workflow.TurnPrompt`): its prompt is the chat template's output followed by
    the tokens of that text, and its generation's ``text`` starts with it. Those tokens stay in the prompt
    (``prompt_token_ids``), so they are never trained, and the behaviour log-probabilities cover only the
    generated tokens. Rows without either are passed to the engine as chats.

    Args:
        cfg: The sampling part of the training config (:func:`generation_config`).
        policy: The policy the engine serves (its tokenizers).
        engine: The rollout engine.
        lock: Held around the engine call; weight syncs take it too (engines are not thread-safe).
        agent_id: The agent.
        chats: B chat conversations (system + user messages).
        greedy: Decode greedily (evaluation) instead of sampling.
        reply_starts: B texts each row's reply starts with, after the ``response_prefix`` (``""``: none); None:
            none.

    Returns:
        B :class:`~services.trainer.rollout.engines.base.Generation` objects (token ids, logprobs, text, version).

    Raises:
        InvalidArgumentError: Unknown agent (the agents are listed), ``reply_starts`` not B strings, or a prompt
            (its prefill included) plus ``max_new_tokens`` beyond the model's length.
        NotFoundError: An agent the engine does not serve.
    """
    sampling = cfg.params(agent_id, greedy)
    prefills = _prefills(cfg.response_prefixes[agent_id], reply_starts, len(chats))
    prompts: list[Any] = chats
    if any(prefills):
        tok = policy.tokenizer(agent_id)
        fill_ids = {
            fill: list(tok(fill, add_special_tokens=False)["input_ids"]) for fill in set(prefills) if fill
        }
        prompts = [
            chat_to_ids(tok, chat) + fill_ids.get(fill, [])
            for chat, fill in zip(chats, prefills, strict=True)
        ]  # each distinct prefill tokenised once (a group's rows share theirs)
    with lock, torch.no_grad():
        gens = engine.generate(agent_id, prompts, sampling)
    if any(prefills):
        gens = [dataclasses.replace(g, text=fill + g.text) for g, fill in zip(gens, prefills, strict=True)]
    return gens


def _prefills(prefix: str, reply_starts: Sequence[str] | None, rows: int) -> list[str]:
    """Each row's prefilled reply start: the agent's ``response_prefix`` then the row's reply start.

    Raises:
        InvalidArgumentError: ``reply_starts`` is not ``rows`` strings (its length or the bad entry named).
    """
    if reply_starts is None:
        return [prefix] * rows
    if isinstance(reply_starts, str) or len(reply_starts) != rows:
        raise InvalidArgumentError(
            f"reply_starts must be one str per chat ({rows}), got {type(reply_starts).__name__} of "
            f"length {len(reply_starts)}"
        )
    for i, start in enumerate(reply_starts):
        if not isinstance(start, str):
            raise InvalidArgumentError(f"reply_starts[{i}] must be a str, got {type(start).__name__}")
    return [prefix + start for start in reply_starts]


class ResidentWeights:
    """The last ``keep`` synced weight payloads of every agent, as CPU copies, for ``agent@VERSION`` calls.

    A payload is what :meth:`~services.trainer.models.policy.MultiAgentPolicy.state_for_sync` gives (the agent's LoRA
    adapter, or its whole state dict). Agents on one weight set (``shared`` mode) share the copy.

    Args:
        keep: Versions kept per agent (the current one included), >= 1; the oldest is evicted first.
    """

    def __init__(self, keep: int) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.keep = keep
        self._by_agent: dict[str, OrderedDict[int, dict[str, torch.Tensor]]] = {}

    def remember(self, agents: Sequence[str], version: int, weights: Mapping[str, torch.Tensor]) -> None:
        """Keep a CPU copy of ``weights`` as ``version`` of every agent in ``agents`` (the agents whose sampled
        weights they are); a version remembered again replaces its payload, and versions above it are
        forgotten (a checkpoint load may move an agent back)."""
        copy = {k: v.detach().to("cpu", copy=True) for k, v in weights.items()}
        for agent in agents:
            held = self._by_agent.setdefault(agent, OrderedDict())
            for v in [v for v in held if v >= version]:
                del held[v]
            held[version] = copy
            while len(held) > self.keep:
                held.popitem(last=False)

    def versions(self, agent: str) -> list[int]:
        """The agent's resident versions, ascending."""
        return sorted(self._by_agent.get(agent, {}))

    def get(self, agent: str, version: int) -> dict[str, torch.Tensor] | None:
        """The payload of ``version``, or None when it is not (or no longer) resident."""
        return self._by_agent.get(agent, {}).get(version)


def serve_generations(
    engine: RolloutEngine,
    lock: threading.Lock,
    resident: ResidentWeights | None,
    agent_id: str,
    prompts: Sequence[list[int]],
    sampling: SamplingParams,
    version: int | None = None,
) -> list[Generation]:
    """One inference-gateway call: sample one response per prompt with the caller's sampling parameters.

    The call's version is fixed when it starts: under ``lock`` (the one weight syncs take), before sampling, it
    is the engine's current version (or the pinned ``version``), and the weights that sample are that version's
    for the whole call: a sync waits for the lock, so a call in flight when an update lands finishes on the
    version it started with, and each :class:`Generation` records that version. A sync landing before the call
    takes the lock (while the call is still queued) is the version it starts with. An older resident version is
    loaded into the engine for the call and the current weights restored after it (engines with a
    ``pinned`` method, i.e. transformers; vLLM serves only its current version). After sampling the engine must
    still hold the version the call started with, and every generation must record it: a weight sync that
    skipped ``lock`` (an owner's bug) fails the call with :class:`AbortedError` rather than return tokens of
    mixed weights under one version.

    Args:
        engine: The actor's rollout engine.
        lock: The actor's engine lock.
        resident: The actor's resident versions; None = only the current version is servable.
        agent_id: The agent.
        prompts: B prompts, token ids (chat templates are applied by the caller).
        sampling: The caller's sampling parameters (not the config's).
        version: A resident version, or None for the current one.

    Returns:
        B generations, in order.

    Raises:
        NotFoundError: Unknown agent, or ``version`` is not resident (the resident ones are named).
        InvalidArgumentError: A prompt plus ``max_new_tokens`` beyond the model's length.
        AbortedError: The agent's weights changed while the call sampled (a sync that did not take ``lock``);
            its generations are discarded, and a retry samples with one version.
    """
    with lock, torch.no_grad():
        current = engine.policy_version(agent_id)
        if version is None or version == current:
            return _stamped(engine, agent_id, current, engine.generate(agent_id, list(prompts), sampling))
        pinned = getattr(engine, "pinned", None)
        weights = resident.get(agent_id, version) if resident is not None and pinned is not None else None
        if weights is None:
            held = resident.versions(agent_id) if resident is not None and pinned is not None else [current]
            raise NotFoundError(
                f"version {version} of agent {agent_id!r} is not resident; resident versions: {held or [current]}"
            )
        with pinned(agent_id, weights, version):
            return _stamped(engine, agent_id, version, engine.generate(agent_id, list(prompts), sampling))


def _stamped(engine: RolloutEngine, agent_id: str, stamp: int, gens: list[Generation]) -> list[Generation]:
    """``gens`` when the engine still holds version ``stamp`` (read before they were sampled) and each records it.

    Raises:
        AbortedError: The version moved while they were sampled (a weight sync that skipped the engine lock).
    """
    now = engine.policy_version(agent_id)
    recorded = sorted({g.policy_version for g in gens})
    if now != stamp or any(v != stamp for v in recorded):
        raise AbortedError(
            f"the weights of agent {agent_id!r} changed while the call sampled: it started on version {stamp}, "
            f"the engine now holds version {now} and the generations record {recorded}; a weight sync did not "
            "take the engine lock. The call's tokens are discarded: retry it"
        )
    return gens


def resident_versions(engine: RolloutEngine, resident: ResidentWeights | None, agent_id: str) -> list[int]:
    """Versions of ``agent_id`` :func:`serve_generations` can serve, ascending (the current one included)."""
    current = engine.policy_version(agent_id)
    if resident is None or getattr(engine, "pinned", None) is None:
        return [current]
    return sorted({*(v for v in resident.versions(agent_id) if v <= current), current})


def engine_max_model_len(engine: RolloutEngine, agent_id: str) -> int:
    """Most prompt-plus-response tokens the engine accepts for the agent (a method of the transformers engine,
    an attribute of the vLLM one)."""
    limit = getattr(engine, "max_model_len", None)
    if callable(limit):
        return int(limit(agent_id))
    if limit is None:
        raise NotFoundError(f"the {type(engine).__name__} engine does not state its max_model_len")
    return int(limit)
