"""Rollout engine on vLLM (GPU; the ``gpu`` extra). vllm is imported only when an engine is constructed.

One ``vllm.LLM`` per distinct model folder; agents naming the same model share it. LoRA agents (``lora=True``)
sample with a per-agent ``LoRARequest`` on one shared base: each ``update_weights`` writes the adapter (peft
format) to a fresh folder and switches the agent to a new request id, so vLLM never serves a stale adapter.
Full-weight agents are synced in place with ``model.load_weights`` (HF parameter names) through
``LLM.apply_model``; the engine core runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so tensors are
handed over without serialisation.

Log-probabilities: ``logprobs=0`` returns the sampled token's log-probability; the engine is created with
``logprobs_mode="raw_logprobs"`` (temperature 1, before filtering) where the installed vLLM accepts it, the
convention of :mod:`services.trainer.rollout.engines.base`.
"""

from __future__ import annotations

import itertools
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from marti.errors import FailedPreconditionError, InvalidArgumentError
from services.trainer.rollout.engines.base import (
    Generation,
    Prompt,
    RolloutEngine,
    SamplingParams,
    check_room,
    normalise_prompts,
)

VLLM_MAX_MODEL_LEN = 2048
"""The most prompt-plus-response tokens a vLLM engine of a job takes (:meth:`VLLMRolloutEngine.from_policy`
leaves ``max_model_len`` at this default, whatever the model's own length)."""


@dataclass(frozen=True)
class VLLMAgent:
    """How one agent is served by vLLM.

    Attributes:
        model: Model name (see :func:`services.trainer.models.loading.resolve_model`) or HF folder.
        lora: Serve the agent through a LoRA adapter on ``model``.
        lora_config: peft ``adapter_config.json`` contents for the agent's adapter (``lora`` only): at least
            ``r``, ``lora_alpha``, ``target_modules``.
    """

    model: str
    lora: bool = False
    lora_config: dict[str, Any] = field(default_factory=dict)


def materialize_model_folder(name: str, work_dir: Path) -> Path:
    """Return an HF folder vLLM can load for ``name`` (converting a GGUF, or saving ``tiny-llama``, as needed)."""
    from services.trainer.models.loading import build_tiny_model, load_model, load_tokenizer
    from services.trainer.models.resolve import resolve_model

    resolved = resolve_model(name)
    if resolved.kind == "hf_dir":
        assert resolved.path is not None
        return resolved.path
    if resolved.kind == "gguf":
        load_model(name)  # converts into the cache
        load_tokenizer(name)
        assert resolved.cache_dir is not None
        return resolved.cache_dir
    folder = work_dir / "tiny-llama"
    if not (folder / "config.json").is_file():
        tok = load_tokenizer("tiny-llama")
        build_tiny_model(tok).save_pretrained(folder)
        tok.save_pretrained(folder)
    return folder


def engine_settings(settings: Any) -> dict[str, Any]:
    """The :class:`VLLMRolloutEngine` keyword arguments the ``vllm`` config section sets (memory share, tensor
    parallelism, and the ``vllm.LLM`` scheduler options), for :meth:`VLLMRolloutEngine.from_policy`.

    Args:
        settings: The ``vllm`` config section (:class:`marti.config.VllmConfig`).
    """
    return {
        "gpu_memory_utilization": settings.gpu_memory_utilization,
        "tensor_parallel_size": settings.tensor_parallel_size,
        "llm_kwargs": {
            "max_num_batched_tokens": settings.max_num_batched_tokens,
            "max_num_seqs": settings.max_num_seqs,
            "enable_prefix_caching": settings.enable_prefix_caching,
        },
    }


def vllm_agents_for(policy: Any, agents: Sequence[str]) -> dict[str, VLLMAgent]:
    """How vLLM serves each agent of a :class:`~services.trainer.models.policy.MultiAgentPolicy`.

    ``lora``: a LoRA request per agent on the one base (the policy's adapter shape); ``shared`` and
    ``per_agent``: the full weights of the agent's ``pretrain_model``.

    Raises:
        InvalidArgumentError: ``per_agent`` agents naming the same model: vLLM holds one set of full weights per
            model folder, so their different weights cannot both be served (use ``policy.mode: lora`` or
            ``rollout.engine: hf``).
    """
    specs = {a.name: a for a in policy.config.agents}
    mode, lora = policy.config.mode, policy.config.lora
    out: dict[str, VLLMAgent] = {}
    for agent in agents:
        model = specs[agent].pretrain_model
        if mode == "lora":
            cfg = {"r": lora.r, "lora_alpha": lora.alpha, "target_modules": list(lora.target_modules)}
            out[agent] = VLLMAgent(model, lora=True, lora_config=cfg)
        else:
            out[agent] = VLLMAgent(model)
    if mode == "per_agent":
        by_model: dict[str, list[str]] = {}
        for agent, spec in out.items():
            by_model.setdefault(spec.model.strip().lower(), []).append(agent)
        clash = [names for names in by_model.values() if len(names) > 1]
        if clash:
            raise InvalidArgumentError(
                f"rollout.engine=vllm serves one set of full weights per model, but per_agent agents {clash[0]} "
                f"share pretrain_model {out[clash[0][0]].model!r}: use policy.mode lora or rollout.engine hf"
            )
    return out


class VLLMRolloutEngine(RolloutEngine):
    """vLLM generation per agent with versioned weight sync (same interface as the HF engine).

    Args:
        agents: agent id -> model name or :class:`VLLMAgent`.
        gpu_memory_utilization: Fraction of GPU memory each ``LLM`` may take, in (0, 1].
        max_model_len: Most prompt-plus-response tokens, > 0.
        max_lora_rank: Largest adapter rank served, > 0.
        tensor_parallel_size: GPUs per ``LLM``, >= 1.
        dtype: vLLM dtype (``"auto"``, ``"bfloat16"``, ``"float32"``...).
        seed: Engine seed.
        default_sampling: Per-agent default :class:`SamplingParams`.
        llm_kwargs: Extra keyword arguments for ``vllm.LLM``.

    Raises:
        FailedPreconditionError: vllm is not installed.
        InvalidArgumentError: A limit is out of range.
    """

    def __init__(
        self,
        agents: Mapping[str, str | VLLMAgent],
        *,
        gpu_memory_utilization: float = 0.3,
        max_model_len: int = VLLM_MAX_MODEL_LEN,
        max_lora_rank: int = 16,
        tensor_parallel_size: int = 1,
        dtype: str = "auto",
        seed: int = 0,
        default_sampling: Mapping[str, SamplingParams] | None = None,
        llm_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(list(agents), default_sampling)
        if not 0.0 < gpu_memory_utilization <= 1.0:
            raise InvalidArgumentError(
                f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}"
            )
        if max_model_len <= 0 or max_lora_rank <= 0 or tensor_parallel_size < 1:
            raise InvalidArgumentError(
                f"max_model_len ({max_model_len}) and max_lora_rank ({max_lora_rank}) must be > 0, "
                f"tensor_parallel_size ({tensor_parallel_size}) >= 1"
            )
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        try:
            import vllm
        except ImportError as exc:
            raise FailedPreconditionError(
                f"VLLMRolloutEngine needs the 'vllm' package (gpu extra): {exc}"
            ) from None
        self._vllm = vllm
        self._work = Path(tempfile.mkdtemp(prefix="marti-vllm-"))
        self._specs = {a: (s if isinstance(s, VLLMAgent) else VLLMAgent(model=s)) for a, s in agents.items()}
        self.max_model_len = max_model_len
        self._llms: dict[str, Any] = {}
        self._tokenizers: dict[str, Any] = {}
        self._folder_of: dict[str, str] = {}
        self._lora_requests: dict[str, Any] = {}
        self._lora_ids = itertools.count(1)
        for agent, spec in self._specs.items():
            folder = str(materialize_model_folder(spec.model, self._work))
            self._folder_of[agent] = folder
            if folder in self._llms:
                continue
            needs_lora = any(s.lora and self._same(s.model, spec.model) for s in self._specs.values())
            kwargs: dict[str, Any] = {
                "model": folder,
                "gpu_memory_utilization": gpu_memory_utilization,
                "max_model_len": max_model_len,
                "tensor_parallel_size": tensor_parallel_size,
                "dtype": dtype,
                "seed": seed,
                "enable_lora": needs_lora,
                "max_lora_rank": max_lora_rank,
                "logprobs_mode": "raw_logprobs",
                **dict(llm_kwargs or {}),
            }
            try:
                llm = vllm.LLM(**kwargs)
            except TypeError:  # older vLLM without logprobs_mode
                kwargs.pop("logprobs_mode")
                llm = vllm.LLM(**kwargs)
            self._llms[folder] = llm
            self._tokenizers[folder] = llm.get_tokenizer()

    @classmethod
    def from_policy(
        cls,
        policy: Any,
        settings: Any,
        agents: Sequence[str],
        *,
        default_sampling: Mapping[str, SamplingParams] | None = None,
        seed_offset: int = 0,
    ) -> VLLMRolloutEngine:
        """An engine serving ``agents`` of a policy (:func:`vllm_agents_for`), sized by the ``vllm`` config.

        The caller loads the policy's weights into it (``update_weights``) before sampling; until then vLLM
        serves the model folders' weights.

        Args:
            policy: The :class:`~services.trainer.models.policy.MultiAgentPolicy`.
            settings: The ``vllm`` config section (:class:`marti.config.VllmConfig`).
            agents: The agents to serve.
            default_sampling: Per-agent default :class:`SamplingParams`.
            seed_offset: Added to the policy's seed (engine ``i`` of ``vllm.num_engines`` gets ``i``, so the
                engines of a pool sample independently).

        Raises:
            FailedPreconditionError: vllm is not installed.
            InvalidArgumentError: see :func:`vllm_agents_for`.
        """
        return cls(
            vllm_agents_for(policy, agents),
            max_lora_rank=max(16, policy.config.lora.r),
            seed=policy.config.seed + seed_offset,
            default_sampling=default_sampling,
            **engine_settings(settings),
        )

    @staticmethod
    def _same(a: str, b: str) -> bool:
        return a.strip().lower() == b.strip().lower()

    def generate(
        self, agent_id: str, prompts: Sequence[Prompt], sampling: SamplingParams | None = None
    ) -> list[Generation]:
        """See :meth:`RolloutEngine.generate`."""
        self._check_agent(agent_id)
        params = sampling or self._default_sampling[agent_id]
        folder = self._folder_of[agent_id]
        llm, tok = self._llms[folder], self._tokenizers[folder]
        ids = normalise_prompts(tok, prompts, len(tok))
        check_room(ids, params.max_new_tokens, self.max_model_len)
        sp = self._vllm.SamplingParams(
            n=1,
            max_tokens=params.max_new_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1,
            stop=list(params.stop) or None,
            seed=params.seed,
            logprobs=0,
        )
        from vllm.inputs import TokensPrompt

        outs = llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in ids],
            sp,
            lora_request=self._lora_requests.get(agent_id),
            use_tqdm=False,
        )
        version = self._versions[agent_id]
        gens = []
        for p, out in zip(ids, outs, strict=True):
            comp = out.outputs[0]
            toks = list(comp.token_ids)
            lps = [float(step[t].logprob) for step, t in zip(comp.logprobs or [], toks, strict=False)]
            gens.append(
                Generation(
                    prompt_token_ids=p,
                    response_token_ids=toks,
                    response_logprobs=lps,
                    text=comp.text,
                    finish_reason="length" if comp.finish_reason == "length" else "stop",
                    policy_version=version,
                    agent_id=agent_id,
                )
            )
        return gens

    def update_weights(self, agent_id: str, weights: Mapping[str, torch.Tensor], policy_version: int) -> None:
        """See :meth:`RolloutEngine.update_weights`: adapter agents get a new LoRA request, others in-place weights."""
        self._check_version(agent_id, policy_version)
        spec = self._specs[agent_id]
        folder = self._folder_of[agent_id]
        if spec.lora:
            self._sync_adapter(agent_id, spec, weights, policy_version)
            self._versions[agent_id] = policy_version
            return
        items = [(k, v.detach()) for k, v in weights.items()]
        llm = self._llms[folder]
        if hasattr(llm, "apply_model"):
            llm.apply_model(lambda model: model.load_weights(items))
        else:
            llm.collective_rpc(lambda worker: worker.model_runner.model.load_weights(items))
        llm.reset_prefix_cache()
        for a in self._agent_ids:  # every full-weight agent on this LLM samples with the new weights
            if self._folder_of[a] == folder and not self._specs[a].lora:
                self._versions[a] = max(self._versions[a], policy_version)

    def _sync_adapter(
        self, agent_id: str, spec: VLLMAgent, weights: Mapping[str, torch.Tensor], version: int
    ) -> None:
        from safetensors.torch import save_file
        from vllm.lora.request import LoRARequest

        if not spec.lora_config:
            raise InvalidArgumentError(f"agent {agent_id!r} is a LoRA agent without lora_config")
        folder = self._work / f"{agent_id}-v{version}-{next(self._lora_ids)}"
        folder.mkdir(parents=True)
        save_file(
            {k: v.detach().contiguous().cpu() for k, v in weights.items()},
            str(folder / "adapter_model.safetensors"),
        )
        cfg = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "bias": "none", **spec.lora_config}
        (folder / "adapter_config.json").write_text(json.dumps(cfg))
        request_id = next(self._lora_ids)
        self._lora_requests[agent_id] = LoRARequest(f"{agent_id}-v{version}", request_id, str(folder))
