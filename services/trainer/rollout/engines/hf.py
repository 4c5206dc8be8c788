"""Rollout engine on transformers ``generate`` (CPU and GPU).

Prompts of one call are batched (at most ``max_batch_size`` per forward) with **left** padding, so every row's
last prompt token sits at the same position and generation appends to all rows at once. Log-probabilities are
read from the raw logits that ``generate(output_logits=True)`` returns (temperature 1, no filtering; see
:mod:`services.trainer.rollout.engines.base`).

Where a response ends (:class:`_RowEnds`): each row ends after its first eos token or after the generated token that
completes a stop string *within the generated text* (the prompt never takes part in the match, unlike
transformers' ``stop_strings`` criterion); the response's ids keep that token, its text is cut before the stop
string. A row that ended while others go on is padded by ``generate`` (with the pad id, which may equal eos); the
engine cuts every row exactly where it ended, so padding is never part of a response or its log-probabilities.

Sampling: a temperature in ``[0, 1e-5)`` (:data:`GREEDY_BELOW`) decodes greedily, as vLLM does; a tiny positive
temperature would otherwise divide the logits into overflow and NaN probabilities.

Each agent maps to an :class:`AgentModel`: its own model (per-agent policies), a model shared with other agents
(shared policy: one update moves every agent on it to the new version), or a peft model plus the name of the
agent's adapter (LoRA policies: one base copy, the adapter is switched per call).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from marti.errors import InvalidArgumentError
from services.trainer.models.model_config import DEFAULT_MAX_POSITIONS
from services.trainer.models.prefix_sharing import can_share, prefill_for_generation
from services.trainer.rollout.engines.base import (
    Generation,
    Prompt,
    RolloutEngine,
    SamplingParams,
    check_room,
    normalise_prompts,
)
from services.trainer.rollout.engines.merged import MergedLoRA, merged_copies
from services.trainer.rollout.engines.precision import needs_copy, sampling_copies

if TYPE_CHECKING:
    from services.trainer.models.policy import MultiAgentPolicy

GREEDY_BELOW = 1e-5
"""Temperatures below this (0 included) decode greedily (vLLM's ``_SAMPLING_EPS``)."""


@dataclass
class AgentModel:
    """What one agent samples with.

    Attributes:
        model: A transformers causal LM, or a peft model holding the agent's adapter.
        tokenizer: The agent's tokenizer (left padding is enforced by the engine).
        adapter_name: Name of the agent's LoRA adapter inside ``model``; None for a plain model.
    """

    model: torch.nn.Module
    tokenizer: Any
    adapter_name: str | None = None


class HFRolloutEngine(RolloutEngine):
    """Batched transformers generation per agent with versioned weight sync.

    Args:
        agents: agent id -> :class:`AgentModel`. Several agents may share one model object.
        device: Where generation runs; models are moved there (default: the models' current device).
        max_batch_size: Most prompts per ``generate`` call, > 0; larger batches are split in order.
        max_model_len: Most tokens of prompt plus response; defaults to the model config's
            ``max_position_embeddings``.
        default_sampling: Per-agent default :class:`SamplingParams`.
        share_prompt_prefix: When a batch repeats a prompt (G samples of a group), prefill each distinct prompt
            once and give its key/value cache to every row that repeats it; when prompts only start alike (a
            chain's later agent: one observation, then a teammate's message that differs per row) and that runs
            fewer tokens, prefill each distinct head once and every row's rest on its cache
            (:func:`~services.trainer.models.prefix_sharing.prefill_for_generation`); the samples are those of
            the plain path up to float rounding.
        dtype: Sample in this dtype (``rollout.dtype`` resolved by
            :func:`~services.trainer.rollout.engines.precision.resolve_rollout_dtype`): a model whose parameters are in
            another dtype is replaced by a converted copy (one per distinct model), which ``update_weights`` and
            ``pinned`` then write into, converting what they load; log-probabilities are those of the copy's
            forward. None (default): the models as given.
        merge_adapters: With ``dtype`` converting a peft LoRA model, the copy of an agent's adapter is a plain model
            with the adapter merged into its linears (:class:`~services.trainer.rollout.engines.merged.MergedLoRA`,
            re-merged by every ``update_weights`` / ``pinned``) when the agents use at most this many adapters of
            that model: one whole base copy in ``dtype`` per adapter. Default 1 (a lone adapter merges at the
            memory of the unmerged copy); 0: never (one unmerged copy per model, adapters switched per call).

    Raises:
        InvalidArgumentError: No agents, ``max_batch_size`` / ``max_model_len`` not positive, or ``merge_adapters``
            not an int >= 0 (a bool, float, str or None included).
    """

    def __init__(
        self,
        agents: Mapping[str, AgentModel],
        *,
        device: str | torch.device | None = None,
        max_batch_size: int = 32,
        max_model_len: int | None = None,
        default_sampling: Mapping[str, SamplingParams] | None = None,
        share_prompt_prefix: bool = True,
        dtype: torch.dtype | None = None,
        merge_adapters: int = 1,
    ) -> None:
        super().__init__(list(agents), default_sampling)
        if max_batch_size <= 0:
            raise InvalidArgumentError(f"max_batch_size must be > 0, got {max_batch_size}")
        if max_model_len is not None and max_model_len <= 0:
            raise InvalidArgumentError(f"max_model_len must be > 0, got {max_model_len}")
        if type(merge_adapters) is not int or merge_adapters < 0:  # bool, float, str, None: refused by name
            raise InvalidArgumentError(f"merge_adapters must be an int >= 0, got {merge_adapters!r}")
        self._merged: dict[str, MergedLoRA] = merged_copies(
            {a: (spec.model, spec.adapter_name) for a, spec in agents.items()}, dtype, merge_adapters
        )
        """agent id -> the merged copy it samples with (its ``_agents`` entry holds that plain model, no adapter)."""
        unmerged = {a: spec for a, spec in agents.items() if a not in self._merged}
        copies = sampling_copies([spec.model for spec in unmerged.values()], dtype)
        self._agents = {
            a: dataclasses.replace(spec, model=m)
            for (a, spec), m in zip(unmerged.items(), copies, strict=True)
        }
        for a, merged in self._merged.items():
            self._agents[a] = dataclasses.replace(agents[a], model=merged.model, adapter_name=None)
        self._agents = {a: self._agents[a] for a in agents}  # config order
        self.dtype = dtype
        self.samples_with_copies = any(self._agents[a].model is not spec.model for a, spec in agents.items())
        """True when some agent samples with a converted (or merged) copy (``dtype``), never with the module it was
        given."""
        self.max_batch_size = max_batch_size
        self.share_prompt_prefix = share_prompt_prefix
        self._max_model_len = max_model_len
        for spec in self._agents.values():
            spec.tokenizer.padding_side = "left"
            if device is not None:
                spec.model.to(device)
            spec.model.eval()

    @classmethod
    def from_policy(
        cls, policy: MultiAgentPolicy, *, copy_weights: bool = True, **kwargs: Any
    ) -> HFRolloutEngine:
        """Build an engine serving every agent of a policy.

        Args:
            policy: The multi-agent policy (per_agent, shared or lora).
            copy_weights: True (default): the engine owns deep copies (one copy per distinct policy model, so
                LoRA agents still share one base), and samples only with synced versions. False: it samples
                with the policy's live modules (colocated, no extra memory; ``update_weights`` only re-tags). A
                ``dtype`` other than the policy's makes the engine own converted copies either way
                (``samples_with_copies``), synced by ``update_weights``.
            **kwargs: Passed to the constructor (``share_prompt_prefix`` defaults to the policy config's;
                ``dtype``).
        """
        memo: dict[int, Any] = {}
        agents: dict[str, AgentModel] = {}
        for agent_id in policy.agent_ids:
            model, tok, adapter = policy.rollout_target(agent_id)
            # a model that needs another dtype is copied (converted) by the constructor instead
            if copy_weights and not needs_copy(model, kwargs.get("dtype")):
                model = memo.setdefault(id(model), copy.deepcopy(model))
            agents[agent_id] = AgentModel(model=model, tokenizer=tok, adapter_name=adapter)
        kwargs.setdefault("share_prompt_prefix", policy.config.share_prompt_prefix)
        return cls(agents, **kwargs)

    def max_model_len(self, agent_id: str) -> int:
        """Return the most prompt-plus-response tokens the agent's model accepts."""
        self._check_agent(agent_id)
        if self._max_model_len is not None:
            return self._max_model_len
        cfg = getattr(self._agents[agent_id].model, "config", None)
        return int(getattr(cfg, "max_position_embeddings", None) or DEFAULT_MAX_POSITIONS)

    def _sharers(self, agent_id: str) -> list[str]:
        """Agents whose sampled weights move with ``agent_id``'s: same model and same adapter."""
        spec = self._agents[agent_id]
        return [
            a
            for a, s in self._agents.items()
            if s.model is spec.model and s.adapter_name == spec.adapter_name
        ]

    def generate(
        self, agent_id: str, prompts: Sequence[Prompt], sampling: SamplingParams | None = None
    ) -> list[Generation]:
        """See :meth:`RolloutEngine.generate`.

        A ``sampling.temperature`` below :data:`GREEDY_BELOW` (``1e-5``, 0 included) decodes greedily. A stop
        string matches only within the generated text (see the module docstring).
        """
        self._check_agent(agent_id)
        params = sampling or self._default_sampling[agent_id]
        spec = self._agents[agent_id]
        weight = spec.model.get_input_embeddings().weight
        vocab = int(getattr(weight, "ds_shape", weight.shape)[0])  # ZeRO-3 partitions it: shape[0] is 0
        ids = normalise_prompts(spec.tokenizer, prompts, vocab)
        check_room(ids, params.max_new_tokens, self.max_model_len(agent_id))
        if spec.adapter_name is not None:
            spec.model.set_adapter(spec.adapter_name)
        out: list[Generation] = []
        with torch.random.fork_rng(devices=self._rng_devices(spec.model), enabled=params.seed is not None):
            if params.seed is not None:
                torch.manual_seed(params.seed)
            for start in range(0, len(ids), self.max_batch_size):
                out.extend(
                    self._generate_batch(agent_id, spec, ids[start : start + self.max_batch_size], params)
                )
        return out

    @staticmethod
    def _rng_devices(model: torch.nn.Module) -> list[int]:
        dev = next(model.parameters()).device
        return [dev.index or 0] if dev.type == "cuda" else []

    def _generate_batch(
        self, agent_id: str, spec: AgentModel, prompts: list[list[int]], params: SamplingParams
    ) -> list[Generation]:
        """Generate for at most ``max_batch_size`` prompts: left-pad, generate, trim, score."""
        tok = spec.tokenizer
        device = next(spec.model.parameters()).device
        pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        input_ids, attention_mask = left_pad(prompts, pad_id)
        width = input_ids.shape[1]
        greedy = params.temperature < GREEDY_BELOW
        kwargs: dict[str, Any] = {
            "max_new_tokens": params.max_new_tokens,
            "do_sample": not greedy,
            "temperature": None if greedy else params.temperature,
            "top_p": None if greedy else params.top_p,
            "top_k": None if greedy else params.top_k,
            "output_logits": True,
            "return_dict_in_generate": True,
            "pad_token_id": pad_id,
            "eos_token_id": self._eos_ids(spec),
        }
        from transformers import StoppingCriteriaList

        row_ends = _RowEnds(tok, width, self._eos_ids(spec), params.stop)
        kwargs["stopping_criteria"] = StoppingCriteriaList([row_ends])
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        with torch.no_grad():
            prefilled = None
            if self.share_prompt_prefix and can_share(spec.model):
                prefilled = prefill_for_generation(spec.model, input_ids, attention_mask)
            if prefilled is not None:  # generate computes only the last prompt token and what follows
                input_ids, attention_mask, kwargs["cache"] = prefilled
            res = spec.model.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        new_tokens = res.sequences[:, width:].cpu()  # (B, A)
        logits = torch.stack(res.logits, dim=1).float()  # (B, A, V) raw, temperature 1
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, new_tokens.to(logits.device).unsqueeze(-1))
        logprobs = logprobs.squeeze(-1).cpu()  # (B, A)
        version = self._versions[agent_id]
        gens = []
        for row, p in enumerate(prompts):
            ended = row_ends.ends[row] if row_ends.ends else None
            toks = new_tokens[row, :ended].tolist()  # what follows the row's end is padding
            end, reason, text = self._trim(spec, toks, ended is not None, params)
            gens.append(
                Generation(
                    prompt_token_ids=p,
                    response_token_ids=toks[:end],
                    response_logprobs=logprobs[row, :end].tolist(),
                    text=text,
                    finish_reason=reason,
                    policy_version=version,
                    agent_id=agent_id,
                )
            )
        return gens

    @staticmethod
    def _eos_ids(spec: AgentModel) -> list[int]:
        ids: set[int] = set()
        gen_cfg = getattr(spec.model, "generation_config", None)
        eos = getattr(gen_cfg, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        elif eos:
            ids.update(int(e) for e in eos)
        if spec.tokenizer.eos_token_id is not None:
            ids.add(int(spec.tokenizer.eos_token_id))
        return sorted(ids)

    @staticmethod
    def _trim(spec: AgentModel, toks: list[int], ended: bool, params: SamplingParams) -> tuple[int, str, str]:
        """:func:`trim_at_stop` with the agent's tokenizer."""
        return trim_at_stop(spec.tokenizer, toks, ended, params)

    def update_weights(self, agent_id: str, weights: Mapping[str, torch.Tensor], policy_version: int) -> None:
        """See :meth:`RolloutEngine.update_weights`; agents sharing the model (and adapter) get the version."""
        self._check_version(agent_id, policy_version)
        spec = self._agents[agent_id]
        if agent_id in self._merged:
            self._merged[agent_id].load(weights)
        elif spec.adapter_name is not None:
            _load_adapter(spec.model, spec.adapter_name, weights)
        else:
            _copy_into(spec.model, weights)
        for a in self._sharers(agent_id):
            self._versions[a] = max(self._versions[a], policy_version)

    @contextlib.contextmanager
    def pinned(
        self, agent_id: str, weights: Mapping[str, torch.Tensor], policy_version: int
    ) -> Iterator[None]:
        """Sample with an older version of the agent's weights for the duration of the block.

        Loads ``weights`` (adapter or (partial) state dict, as :meth:`update_weights` takes them) without the
        monotonic-version check, tags the generations of the block with ``policy_version``, and on exit restores
        the weights it replaced (a CPU snapshot taken on entry) and the current versions. The caller must hold
        the lock its weight syncs take, so no sync and no other call sees the pinned weights.

        Args:
            agent_id: The agent.
            weights: The pinned version's weights.
            policy_version: Its version, >= 0.

        Raises:
            NotFoundError: Unknown agent.
            InvalidArgumentError: A key or shape the model lacks (nothing is loaded then).
        """
        self._check_agent(agent_id)
        if not isinstance(policy_version, int) or policy_version < 0:
            raise InvalidArgumentError(f"policy_version must be an int >= 0, got {policy_version!r}")
        spec = self._agents[agent_id]
        sharers = self._sharers(agent_id)
        saved_versions = {a: self._versions[a] for a in sharers}
        merged = self._merged.get(agent_id)
        if merged is not None:
            snapshot = merged.adapter_state()
            merged.load(weights)
        elif spec.adapter_name is not None:
            from peft import get_peft_model_state_dict

            current = get_peft_model_state_dict(spec.model, adapter_name=spec.adapter_name)
            snapshot = {k: v.detach().to("cpu", copy=True) for k, v in current.items()}
            _load_adapter(spec.model, spec.adapter_name, weights)
        else:
            state = spec.model.state_dict()
            missing = [k for k in weights if k not in state]
            if missing:
                raise InvalidArgumentError(f"weight {missing[0]!r} is not in the model ({len(state)} keys)")
            snapshot = {k: state[k].detach().to("cpu", copy=True) for k in weights}
            _copy_into(spec.model, weights)
        try:
            for a in sharers:
                self._versions[a] = policy_version
            yield
        finally:
            if merged is not None:
                merged.load(snapshot)
            elif spec.adapter_name is not None:
                _load_adapter(spec.model, spec.adapter_name, snapshot)
            else:
                _copy_into(spec.model, snapshot)
            self._versions.update(saved_versions)


def trim_at_stop(
    tokenizer: Any, toks: list[int], ended: bool, params: SamplingParams
) -> tuple[int, str, str]:
    """Cut a row after its first completed stop string and name its finish reason.

    Args:
        tokenizer: The agent's tokenizer (it decodes).
        toks: The row's generated ids up to where it ended (:class:`_RowEnds`), without padding.
        ended: Whether the row ended by eos or a stop string (False: it ran to ``max_new_tokens``).
        params: The sampling parameters (their stop strings).

    Returns:
        (number of response tokens kept, finish reason, decoded text cut before the stop string).
    """
    tok = tokenizer
    end, reason = len(toks), "stop" if ended else "length"
    text = tok.decode(toks, skip_special_tokens=True)
    if params.stop and any(s in text for s in params.stop):
        lo, hi = 1, end  # smallest prefix whose text holds a stop string (containment grows with length)
        while lo < hi:
            mid = (lo + hi) // 2
            if any(s in tok.decode(toks[:mid], skip_special_tokens=True) for s in params.stop):
                hi = mid
            else:
                lo = mid + 1
        end, reason = lo, "stop"
        text = tok.decode(toks[:end], skip_special_tokens=True)
        text = text[: min(text.find(s) for s in params.stop if s in text)]
    return end, reason, text


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad B prompts to the longest one's length T.

    Returns:
        ``(input_ids, attention_mask)``: (B, T) int64 ids with ``pad_id`` on the left, and (B, T) int64 0/1 mask
        (1 on the prompt's tokens), both on the CPU.
    """
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)  # (B, T)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)  # (B, T)
    for row, p in enumerate(prompts):
        input_ids[row, width - len(p) :] = torch.tensor(p)
        attention_mask[row, width - len(p) :] = 1
    return input_ids, attention_mask


class _RowEnds:
    """A ``generate`` stopping criterion that records where each row of the call really ends, and ends it there.

    A row ends at the first step that gives it an eos token or completes one of ``stop`` within the text decoded
    from its generated tokens alone (transformers' ``stop_strings`` criterion also reads the prompt's last tokens,
    so a prompt ending in ``"\\n"`` made a single generated ``"\\n"`` match ``"\\n\\n"``). Tokens ``generate``
    appends to a row after its end (padding) are never looked at.

    Checking a stop string decodes a window of the row's last tokens holding at least the longest stop string's
    length in characters before the newest token (widened when it holds too few), and confirms a hit on the
    whole generated text, so a row never ends on a match the full text lacks. A match the window misses only
    lets the row run on; :meth:`HFRolloutEngine._trim` cuts at the first match either way.

    Attributes:
        ends: After ``generate``, per row the number of generated tokens up to and including the one that ended
            it, or None when it ran to ``max_new_tokens`` (empty before the first step).
    """

    def __init__(
        self, tokenizer: Any, prompt_width: int, eos_ids: Sequence[int], stop: Sequence[str]
    ) -> None:
        self._tok = tokenizer
        self._width = prompt_width
        self._eos = frozenset(int(e) for e in eos_ids)
        self._stop = tuple(stop)
        # characters a window must hold before the newest token: the longest stop string, plus room for the
        # replacement characters or dropped space that decoding a window from the middle of the text may start with
        self._span = max((len(s) for s in self._stop), default=0) + 4
        self._seen = 0
        self._tokens: list[list[int]] = []
        self.ends: list[int | None] = []

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        """Return (B,) bool: whether each row has ended (it stays ended)."""
        if not self.ends:
            self.reset(input_ids.shape[0])
        new = input_ids[:, self._width + self._seen :].tolist()
        self._seen = input_ids.shape[1] - self._width
        for row, fresh in enumerate(new):
            for t in fresh:
                if self.push(row, t):
                    break
        return torch.tensor([e is not None for e in self.ends], dtype=torch.bool, device=input_ids.device)

    def reset(self, rows: int) -> None:
        """Start tracking ``rows`` rows, none of them ended and none with a generated token."""
        self._tokens = [[] for _ in range(rows)]
        self.ends = [None] * rows

    def push(self, row: int, token: int) -> bool:
        """Append one generated token to ``row`` (ignored once the row has ended); True when the row has ended,
        with this token or before it."""
        if self.ends[row] is not None:
            return True
        toks = self._tokens[row]
        toks.append(token)
        if token in self._eos or (self._stop and self._completes_stop(toks)):
            self.ends[row] = len(toks)
            return True
        return False

    def _decode(self, toks: list[int]) -> str:
        return self._tok.decode(toks, skip_special_tokens=True)

    def _completes_stop(self, toks: list[int]) -> bool:
        """Whether the generated text ``toks`` decodes to holds a stop string (none did one token earlier)."""
        newest = len(self._decode(toks[-1:]))
        window = self._span + 1
        while True:
            start = max(0, len(toks) - window)
            text = self._decode(toks[start:])
            if start == 0 or len(text) >= newest + self._span:
                break
            window *= 2
        if not any(s in text for s in self._stop):
            return False
        return start == 0 or any(s in self._decode(toks) for s in self._stop)


def _copy_into(model: torch.nn.Module, weights: Mapping[str, torch.Tensor]) -> None:
    """Copy a full or partial state dict into ``model`` in place, validating every key and shape first."""
    target = model.state_dict()
    for key, value in weights.items():
        if key not in target:
            raise InvalidArgumentError(f"weight {key!r} is not in the model ({len(target)} keys)")
        if tuple(value.shape) != tuple(target[key].shape):
            raise InvalidArgumentError(
                f"weight {key!r} has shape {tuple(value.shape)}, the model expects {tuple(target[key].shape)}"
            )
    with torch.no_grad():
        for key, value in weights.items():
            dst = target[key]
            if dst.data_ptr() != value.data_ptr():
                dst.copy_(value.to(device=dst.device, dtype=dst.dtype))


def _load_adapter(model: torch.nn.Module, adapter_name: str, weights: Mapping[str, torch.Tensor]) -> None:
    """Load LoRA adapter weights (``get_peft_model_state_dict`` keys) into the named adapter."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    current = get_peft_model_state_dict(model, adapter_name=adapter_name)
    for key, value in weights.items():
        if key not in current:
            raise InvalidArgumentError(
                f"adapter weight {key!r} is not in adapter {adapter_name!r} ({len(current)} keys)"
            )
        if tuple(value.shape) != tuple(current[key].shape):
            raise InvalidArgumentError(
                f"adapter weight {key!r} has shape {tuple(value.shape)}, expected {tuple(current[key].shape)}"
            )
    result = set_peft_model_state_dict(model, dict(weights), adapter_name=adapter_name)
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise InvalidArgumentError(f"adapter {adapter_name!r} rejected weights {unexpected[:3]}")
