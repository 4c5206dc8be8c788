"""Rollout engine with its own decode loop over a preallocated key/value cache (CPU and GPU).

:class:`StaticCacheRolloutEngine` is :class:`~services.trainer.rollout.engines.hf.HFRolloutEngine` (same agents, LoRA
adapters per agent on one base, versioned ``update_weights``, ``pinned``, seeds, prompt checks, stop-string and
eos handling, :class:`~services.trainer.rollout.engines.base.Generation` outputs) with ``generate``'s per-token machinery
replaced by a loop of plain model forwards (on the CPU, Llama and Qwen2 models through
:class:`~services.trainer.rollout.engines.lean.LeanCausalLM` unless ``lean=False``). Log-probabilities keep the
semantics of :mod:`services.trainer.rollout.engines.base`: ``log_softmax`` of the raw fp32 logits at the sampled
token, computed per step as ``logit[token] - logsumexp(logits)`` (no (B, A, V) tensor of logits is kept).

Two decode paths, chosen per call:

* **eager** (the default; the only one on CPU unless asked for): the cache is a :class:`_PreallocatedLayer` per
  model layer, one (B, H, T + A, D) buffer written in place, so a step appends without ``torch.cat``'s copy of
  the whole cache and attends over the filled positions only. Rows that ended (eos or stop string) leave the
  batch: the cache, mask and positions are gathered to the rows still running once the rows saved make it worth
  the copy (:func:`_worth_compacting`). Repeated prompts (a group's G samples, or ``n`` of a request) are
  prefilled once and their cache rows copied to the repeats, and prompts that only start alike prefill their
  common head once and each row's rest on its cache, when that runs fewer tokens (``share_prompt_prefix``,
  :func:`~services.trainer.models.prefix_sharing.prefix_layout`).
* **compiled** (``compile=True``, or ``compile=None`` with the model on CUDA): one decode step (a (B, 1) forward
  over a transformers ``StaticCache``) runs through ``torch.compile``; on CUDA with ``mode="reduce-overhead"``,
  i.e. CUDA graphs. Shapes are made static: the batch is padded to a power of two with copies of its last row and
  the cache length rounded up to a multiple of :data:`CACHE_LEN_BUCKET`, and one cache per (model, batch, length)
  bucket is kept and reset between calls (a fixed address that CUDA graphs replay into). Rows never leave the
  batch here (that would change shapes); the loop stops when every row has ended. The prompt is prefilled eagerly.

Sampling (temperature, then top-k, then top-p, then one draw from the softmax, :func:`draw`) applies
transformers' warpers in ``generate``'s order on the fp32 logits, and a temperature below
:data:`~services.trainer.rollout.engines.hf.GREEDY_BELOW` decodes greedily. Given equal logits a greedy response is the
HF engine's token for token; sampled responses have the same distribution, but not the same draws (``generate``
draws with ``torch.multinomial``, this engine by inverting the cumulative distribution, :func:`draw`, several
times faster on the CPU at a 49k vocabulary: see its timings).

Shapes: B rows, U distinct prompts, T prompt width (left-padded), A generated tokens, V vocabulary, H key/value
heads, D head size, L cache length.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from typing import Any

import torch
from transformers.cache_utils import DynamicLayer

from marti.errors import InvalidArgumentError
from services.trainer.models.prefix_sharing import (
    PrefixLayout,
    can_share,
    layer_types,
    moves_padding,
    position_ids,
    prefix_layout,
)
from services.trainer.rollout.engines.base import Generation, SamplingParams
from services.trainer.rollout.engines.hf import GREEDY_BELOW, AgentModel, HFRolloutEngine, _RowEnds, left_pad
from services.trainer.rollout.engines.lean import LeanCausalLM, supports

__all__ = ["CACHE_LEN_BUCKET", "StaticCacheRolloutEngine", "draw", "sample_tokens"]

CACHE_LEN_BUCKET = 64
"""The compiled path rounds the cache length (prompt width + ``max_new_tokens``) up to a multiple of this, so calls
of similar lengths reuse one compiled graph."""


class StaticCacheRolloutEngine(HFRolloutEngine):
    """:class:`~services.trainer.rollout.engines.hf.HFRolloutEngine` with a lean decode loop (see the module docstring).

    Args:
        agents: agent id -> :class:`~services.trainer.rollout.engines.hf.AgentModel`, as for the HF engine.
        compile: Run decode steps through ``torch.compile`` over a static cache (CUDA graphs on CUDA). None
            (default): only when the agent's model is on CUDA; the eager loop otherwise (on CPU the compile time
            is not won back at rollout sizes; see docs/benchmarks.md).
        lean: In the eager loop, run models that :func:`~services.trainer.rollout.engines.lean.supports` accepts
            (Llama-family, on the CPU) through :class:`~services.trainer.rollout.engines.lean.LeanCausalLM`
            instead of their transformers forward (default True); False always runs the transformers forward.
        **kwargs: ``device``, ``max_batch_size``, ``max_model_len``, ``default_sampling``,
            ``share_prompt_prefix``: as for :class:`~services.trainer.rollout.engines.hf.HFRolloutEngine`.

    Raises:
        InvalidArgumentError: As the HF engine's constructor.
    """

    def __init__(
        self,
        agents: Mapping[str, AgentModel],
        *,
        compile: bool | None = None,
        lean: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(agents, **kwargs)
        self.compile = compile
        self.lean = lean
        self._lean_models: dict[int, LeanCausalLM] = {}
        self._compiled_step: Any = None
        self._static_caches: dict[tuple[int, int, int], Any] = {}
        self.last_stats: dict[str, Any] = {}
        """What the last batch did: ``path`` (``eager`` or ``compiled``), ``steps`` (forwards after the prefill),
        ``row_steps`` (rows computed, summed over those steps), ``compactions`` (eager only), ``prefill_rows`` (the
        rows of the first prefill forward: the distinct prompts or heads when shared), ``prefill_tokens`` (eager
        only: the tokens every prefill forward ran), and
        (eager only) ``forward`` (``lean`` or ``transformers``: which forward ran) and ``prefill_s`` / ``decode_s``:
        wall seconds of the prefill and of the decode loop."""

    def _forward(self, model: torch.nn.Module) -> Any:
        """The eager loop's forward for ``model``: ``(input_ids (B, q), attention_mask (B, L), position_ids (B, q),
        cache) -> (B, V)`` logits of each row's last position. The model's
        :class:`~services.trainer.rollout.engines.lean.LeanCausalLM` (kept per model, its packed weights refreshed
        for the weights that changed) when ``lean`` and the model is supported; its transformers forward otherwise.
        """
        if not (self.lean and supports(model)):
            return functools.partial(_transformers_forward, model)
        runner = self._lean_models.get(id(model))
        if runner is None or runner.model is not model:
            runner = self._lean_models[id(model)] = LeanCausalLM(model)
        else:
            runner.refresh()
        return runner

    def _use_compiled(self, device: torch.device) -> bool:
        return device.type == "cuda" if self.compile is None else bool(self.compile)

    def _generate_batch(
        self, agent_id: str, spec: AgentModel, prompts: list[list[int]], params: SamplingParams
    ) -> list[Generation]:
        """Generate for at most ``max_batch_size`` prompts: left-pad, prefill, decode, trim, score."""
        tok = spec.tokenizer
        model = spec.model
        device = next(model.parameters()).device
        pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        input_ids, attention_mask = left_pad(prompts, pad_id)
        eos = self._eos_ids(spec)
        row_ends = _RowEnds(tok, input_ids.shape[1], eos, params.stop)
        row_ends.reset(len(prompts))
        if self._use_compiled(device):
            tokens, logprobs = self._decode_compiled(
                model, input_ids, attention_mask, params, row_ends, device
            )
        else:
            tokens, logprobs = self._decode_eager(model, input_ids, attention_mask, params, row_ends, device)
        version = self._versions[agent_id]
        gens = []
        for row, p in enumerate(prompts):
            ended = row_ends.ends[row]
            toks = tokens[row][: ended if ended is not None else params.max_new_tokens]
            end, reason, text = self._trim(spec, toks, ended is not None, params)
            gens.append(
                Generation(
                    prompt_token_ids=p,
                    response_token_ids=toks[:end],
                    response_logprobs=logprobs[row][:end],
                    text=text,
                    finish_reason=reason,
                    policy_version=version,
                    agent_id=agent_id,
                )
            )
        return gens

    # --- eager path ---------------------------------------------------------------------------------------------

    def _decode_eager(
        self,
        model: torch.nn.Module,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        params: SamplingParams,
        row_ends: _RowEnds,
        device: torch.device,
    ) -> tuple[list[list[int]], list[list[float]]]:
        """Prefill (sharing repeated prompts) and decode with rows leaving the batch as they end.

        Args:
            model: The agent's model (adapter already active).
            input_ids: (B, T) left-padded prompts (CPU).
            attention_mask: (B, T) 0/1 (CPU).
            params: Sampling parameters.
            row_ends: Tracks where every row ends (reset to B rows); updated in place.
            device: The model's device.

        Returns:
            ``(tokens, logprobs)``: per row the generated ids and their raw log-probabilities, up to where the row
            ended (or ``max_new_tokens``).
        """
        rows, width = input_ids.shape
        steps = params.max_new_tokens
        capacity = width + steps - 1  # the last sampled token is never fed back
        ids = input_ids.to(device)
        mask = torch.ones((rows, capacity), dtype=torch.long, device=device)  # (B, L): generated slots are 1
        mask[:, :width] = attention_mask.to(device)
        cache = _preallocated_cache(model, capacity)
        layout = None
        if self.share_prompt_prefix and can_share(model):
            layout = prefix_layout(ids, mask[:, :width], width, move_padding=moves_padding(model))
        if layout is not None:  # prompts' padding moved after their tokens, where it may be (same function)
            ids, mask[:, :width] = layout.input_ids, layout.attention_mask
        positions = position_ids(mask[:, :width])  # (B, T): padding skipped
        started = time.perf_counter()
        # not inference_mode: parameters a forward writes become inference tensors, whose requires_grad peft's
        # set_adapter cannot switch at the next call (the design launch script's job, DeepSpeed ZeRO-3 with LoRA
        # adapters, failed so: tests/e2e/examples/test_launch_script.py)
        forward = self._forward(model)
        with torch.no_grad():
            if layout is None:
                prefill_rows, prefill_tokens = rows, rows * width
                logits = forward(ids, mask[:, :width], positions, cache)
            else:
                logits, prefill_rows, prefill_tokens = _prefill_shared(
                    forward, ids, mask[:, :width], positions, cache, layout
                )
            prefilled = time.perf_counter()
            live = list(range(rows))  # batch index -> row, of the rows still computed
            next_pos = positions[:, -1:] + 1  # (B, 1)
            tokens: list[list[int]] = [[] for _ in range(rows)]
            logprobs: list[list[float]] = [[] for _ in range(rows)]
            row_steps, compactions, forwards = 0, 0, 0
            for step in range(steps):
                new, lp = sample_tokens(logits, params)
                running = _record(new, lp, live, row_ends, tokens, logprobs)
                if not running or step == steps - 1:
                    break
                if len(running) < len(live) and _worth_compacting(len(live), len(running), steps - step - 1):
                    keep = torch.tensor(running, device=device)
                    cache.batch_select_indices(keep)
                    mask, next_pos, new = mask[keep], next_pos[keep], new[keep]
                    live = [live[i] for i in running]
                    compactions += 1
                logits = forward(new.unsqueeze(-1), mask[:, : width + step + 1], next_pos, cache)
                next_pos = next_pos + 1
                row_steps += len(live)
                forwards += 1
        self.last_stats = {
            "path": "eager",
            "forward": "lean" if isinstance(forward, LeanCausalLM) else "transformers",
            "steps": forwards,
            "row_steps": row_steps,
            "compactions": compactions,
            "prefill_rows": prefill_rows,
            "prefill_tokens": prefill_tokens,
            "prefill_s": prefilled - started,
            "decode_s": time.perf_counter() - prefilled,
        }
        return tokens, logprobs

    # --- compiled path ------------------------------------------------------------------------------------------

    def _decode_compiled(
        self,
        model: torch.nn.Module,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        params: SamplingParams,
        row_ends: _RowEnds,
        device: torch.device,
    ) -> tuple[list[list[int]], list[list[float]]]:
        """Prefill eagerly into a bucketed ``StaticCache``, then decode with the compiled step (fixed shapes).

        Same arguments and result as :meth:`_decode_eager`.
        """
        rows, width = input_ids.shape
        steps = params.max_new_tokens
        batch = 1 << (rows - 1).bit_length()  # next power of two
        length = -(-(width + steps) // CACHE_LEN_BUCKET) * CACHE_LEN_BUCKET
        if batch > rows:  # padding rows repeat the last row; their outputs are dropped
            extra = batch - rows
            input_ids = torch.cat([input_ids, input_ids[-1:].expand(extra, -1)])
            attention_mask = torch.cat([attention_mask, attention_mask[-1:].expand(extra, -1)])
        cache = self._static_cache(model, batch, length)
        mask = torch.ones((batch, length), dtype=torch.long, device=device)  # (Bb, L)
        mask[:, :width] = attention_mask.to(device)
        positions = (mask[:, :width].cumsum(-1) - 1).clamp(min=0)
        step_fn = self._compiled(device)
        tokens: list[list[int]] = [[] for _ in range(rows)]
        logprobs: list[list[float]] = [[] for _ in range(rows)]
        forwards = 0
        with torch.no_grad():  # not inference_mode: the reused static cache is written in place across calls
            out = model(
                input_ids=input_ids.to(device),
                attention_mask=mask,
                position_ids=positions,
                cache=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            logits = out.logits[:, -1].to(torch.float32, copy=True)
            next_pos = positions[:, -1:] + 1
            for step in range(steps):
                new, lp = sample_tokens(logits[:rows], params)
                running = _record(new, lp, range(rows), row_ends, tokens, logprobs)
                if not running or step == steps - 1:
                    break
                feed = torch.cat([new, new.new_full((batch - rows,), int(new[-1]))]) if batch > rows else new
                if device.type == "cuda":
                    torch.compiler.cudagraph_mark_step_begin()
                # a copy: a CUDA graph's output buffer is overwritten by the next replay
                logits = step_fn(model, feed.unsqueeze(-1), mask, next_pos, cache).to(
                    torch.float32, copy=True
                )
                next_pos = next_pos + 1
                forwards += 1
        self.last_stats = {
            "path": "compiled",
            "steps": forwards,
            "row_steps": forwards * batch,
            "compactions": 0,
            "prefill_rows": batch,
        }
        return tokens, logprobs

    def _compiled(self, device: torch.device) -> Any:
        """The compiled decode step (built once per engine); CUDA graphs (``reduce-overhead``) on CUDA only."""
        if self._compiled_step is None:
            mode = "reduce-overhead" if device.type == "cuda" else "default"
            self._compiled_step = torch.compile(_decode_step, mode=mode, dynamic=False)
        return self._compiled_step

    def _static_cache(self, model: torch.nn.Module, batch: int, length: int) -> Any:
        """A transformers ``StaticCache`` of (batch, length) for ``model``, reused (reset) across calls."""
        from transformers import StaticCache

        key = (id(model), batch, length)
        cache = self._static_caches.get(key)
        if cache is None:  # its buffers are allocated by the first (eager) prefill
            cache = StaticCache(config=model.config, max_cache_len=length)
            self._static_caches[key] = cache
        else:
            cache.reset()  # zeroes in place: the buffers keep their addresses
        return cache


def _record(
    new: torch.Tensor,
    lp: torch.Tensor,
    live: Any,
    row_ends: _RowEnds,
    tokens: list[list[int]],
    logprobs: list[list[float]],
) -> list[int]:
    """Append each sampled token and its log-probability to its row, unless the row has already ended.

    Args:
        new: (B,) sampled ids; batch index ``i`` is row ``live[i]``.
        lp: (B,) their raw log-probabilities.
        live: Batch index -> row.
        row_ends: Where rows end; updated in place.
        tokens: Per row, its generated ids; appended to.
        logprobs: Per row, their log-probabilities; appended to.

    Returns:
        The batch indices of the rows still running after this step.
    """
    running = []
    for i, (t, v) in enumerate(zip(new.tolist(), lp.tolist(), strict=True)):
        row = live[i]
        if row_ends.ends[row] is None:
            tokens[row].append(t)
            logprobs[row].append(v)
            if not row_ends.push(row, t):
                running.append(i)
    return running


def _transformers_forward(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    cache: Any,
) -> torch.Tensor:
    """The model's own forward of ``input_ids`` (B, q) after ``cache``: (B, V) logits of each row's last position."""
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        cache=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    return out.logits[:, -1]


def _decode_step(
    model: torch.nn.Module,
    ids: torch.Tensor,
    mask: torch.Tensor,
    positions: torch.Tensor,
    cache: Any,
) -> torch.Tensor:
    """One decode forward: (B, 1) ids, (B, L) mask, (B, 1) positions over a static cache -> (B, V) logits."""
    return model(
        input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True
    ).logits[:, -1]


def _worth_compacting(live: int, running: int, steps_left: int) -> bool:
    """Whether to gather the cache to the ``running`` rows of ``live``: gathering copies the cache once (about one
    step's cache traffic for ``live`` rows), dropping ``live - running`` rows saves their share of every one of the
    ``steps_left`` steps still to run."""
    return (live - running) * steps_left >= live


def sample_tokens(logits: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row and return it with its raw log-probability.

    The draw applies transformers' warpers in ``generate``'s order: temperature, top-k (keep logits >= the k-th
    largest), top-p (drop the smallest tokens whose cumulative mass is <= 1 - top_p, keeping at least one), then
    one draw from the softmax (:func:`draw`, with the global RNG as ``generate``). A temperature below
    :data:`~services.trainer.rollout.engines.hf.GREEDY_BELOW` takes the arg max instead.

    Args:
        logits: (B, V) raw logits of the next token, any float dtype.
        params: The sampling parameters.

    Returns:
        ``(tokens, logprobs)``: (B,) int64 ids and (B,) fp32 ``log_softmax(logits)[token]`` of the raw logits
        (temperature 1, no filtering; see :mod:`services.trainer.rollout.engines.base`).
    """
    raw = logits.float()  # (B, V)
    if params.temperature < GREEDY_BELOW:
        new = raw.argmax(-1)
    else:
        scores = raw / params.temperature if params.temperature != 1.0 else raw
        if params.top_k:
            kth = torch.topk(scores, min(params.top_k, scores.shape[-1]))[0][..., -1:]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if params.top_p < 1.0:
            sorted_scores, order = torch.sort(scores, descending=False)
            drop = sorted_scores.softmax(-1).cumsum(-1) <= 1 - params.top_p
            drop[..., -1:] = False
            scores = scores.masked_fill(drop.scatter(1, order, drop), float("-inf"))
        new = draw(scores.softmax(-1))
    lp = raw.gather(-1, new.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(raw, dim=-1)
    return new, lp


def draw(probs: torch.Tensor) -> torch.Tensor:
    """One token per row from ``probs`` by inverse transform sampling: the first index whose cumulative mass
    exceeds a uniform draw ``u * total`` (``torch.rand``, the global RNG).

    The distribution of ``torch.multinomial(probs, 1)`` up to float64 rounding (the cumulative sum is float64, so
    a token keeps its share down to about 1e-16 of a row's mass; in float32 about 1e-4 of the mass of a 49k
    vocabulary fell on tokens the sum could not tell apart), at a fraction of ``multinomial``'s cost on the CPU:
    one cumulative sum and a binary search per row (0.13-0.2 ms for (8, 49152) on 2 threads, up to 2 ms in a
    process whose allocator maps the (B, V) sum afresh on every call, against ``multinomial``'s 5.9 ms). A token
    of probability 0 is never drawn: the search takes the first cumulative sum strictly above ``u * total``
    (``u < 1``), and a draw that rounding puts at the total is moved to the row's last token of positive
    probability.

    Args:
        probs: (B, V) non-negative weights per row, each row with a positive finite sum.

    Returns:
        (B,) int64 token ids.

    Raises:
        FloatingPointError: A row's sum is NaN, infinite or not positive (a diverged model's logits), naming the
            rows, as ``torch.multinomial`` refuses such a row.
    """
    cdf = probs.cumsum(-1, dtype=torch.float64)  # (B, V)
    total = cdf[:, -1:]  # (B, 1)
    u = torch.rand(probs.shape[0], 1, device=probs.device, dtype=cdf.dtype) * total
    new = torch.searchsorted(cdf, u, right=True).clamp_(max=probs.shape[-1] - 1)  # (B, 1)
    bad = ~torch.isfinite(total) | (total <= 0)  # (B, 1)
    bad_rows, at_total = torch.stack([bad.any(), (probs.gather(-1, new) <= 0).any()]).tolist()  # one sync
    if bad_rows:
        rows = bad.squeeze(1).nonzero().squeeze(1).tolist()
        raise FloatingPointError(f"cannot sample: rows {rows} have no finite positive probability mass")
    if at_total:  # rounding put u * total at the total
        last = probs.shape[-1] - 1 - (probs > 0).flip(-1).to(torch.uint8).argmax(-1, keepdim=True)
        new = torch.minimum(new, last)
    return new.squeeze(1)


# --- the eager path's cache ---------------------------------------------------------------------------------------


def _prefill_shared(
    forward: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    positions: torch.Tensor,
    cache: Any,
    layout: PrefixLayout,
) -> tuple[torch.Tensor, int, int]:
    """Prefill a :func:`~services.trainer.models.prefix_sharing.prefix_layout`: each distinct head once, its cache
    rows repeated to the B rows, then every row's prompt columns after its head on that cache.

    Args:
        forward: The eager loop's forward (:meth:`StaticCacheRolloutEngine._forward`).
        input_ids: (B, W) the layout's prompts, on the model's device.
        attention_mask: (B, W) its mask.
        positions: (B, W) rotary positions.
        cache: An empty :func:`_preallocated_cache`.
        layout: The layout (its ``head`` at most W).

    Returns:
        ``(logits, prefill_rows, prefill_tokens)``: (B, V) logits of every row's last prompt column, the rows the
        heads' forward ran (U) and the tokens both forwards ran (``U * head + B * (W - head)``).
    """
    rows, width = input_ids.shape
    head = layout.head
    first, inverse = layout.first.to(input_ids.device), layout.inverse.to(input_ids.device)
    logits = forward(input_ids[first, :head], attention_mask[first, :head], positions[first, :head], cache)
    cache.batch_select_indices(inverse)
    if head == width:
        return logits[inverse], first.numel(), first.numel() * head
    logits = forward(input_ids[:, head:], attention_mask, positions[:, head:], cache)
    return logits, first.numel(), first.numel() * head + rows * (width - head)


def _preallocated_cache(model: torch.nn.Module, capacity: int) -> Any:
    """A transformers ``Cache`` of :class:`_PreallocatedLayer` (``capacity`` positions) for a model whose layers
    are all full attention; any other layout (sliding windows, linear attention) gets a ``DynamicCache`` for its
    config, which is correct but copies on every step.

    Raises:
        InvalidArgumentError: ``capacity`` < 1.
    """
    from transformers import DynamicCache
    from transformers.cache_utils import Cache

    if capacity < 1:
        raise InvalidArgumentError(f"cache capacity must be >= 1, got {capacity}")
    types = layer_types(model)
    if not types or any(t != "full_attention" for t in types):
        return DynamicCache(config=model.config)
    return Cache(layers=[_PreallocatedLayer(capacity) for _ in types])


class _PreallocatedLayer(DynamicLayer):
    """A transformers ``DynamicLayer`` whose keys and values live in one (B, H, L, D) buffer written in place.

    ``keys`` / ``values`` are views of the filled positions, so attention, masks (``get_mask_sizes``) and
    ``get_seq_length`` behave as for a ``DynamicLayer``, without its ``torch.cat`` of the whole cache per step.

    Args:
        capacity: L, the most positions it holds.
    """

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self._filled = 0
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Allocate the (B, H, L, D) buffers with the first states' batch, heads, dtype and device."""
        rows, heads = key_states.shape[:2]
        self.device = key_states.device
        self._k = key_states.new_empty((rows, heads, self.capacity, key_states.shape[-1]))
        self._v = value_states.new_empty((rows, value_states.shape[1], self.capacity, value_states.shape[-1]))
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write (B, H, q, D) new states after the filled ones; returns the (B, H, filled, D) views.

        Raises:
            InvalidArgumentError: The states would overflow ``capacity``.
        """
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self._filled + key_states.shape[-2]
        if end > self.capacity:
            raise InvalidArgumentError(f"key/value cache overflow: {end} positions, capacity {self.capacity}")
        self._k[:, :, self._filled : end].copy_(key_states)
        self._v[:, :, self._filled : end].copy_(value_states)
        self._filled = end
        self._refresh()
        return self.keys, self.values

    def _refresh(self) -> None:
        self.keys = self._k[:, :, : self._filled]
        self.values = self._v[:, :, : self._filled]

    def get_seq_length(self) -> int:
        """Positions filled so far."""
        return self._filled

    def get_max_length(self) -> int:
        """The capacity L."""
        return self.capacity

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep (and repeat) the rows ``indices`` (R,) in that order; copies the filled positions only."""
        if not self.is_initialized:
            return
        idx = indices.to(self._k.device)
        k = self._k.new_empty((idx.numel(), *self._k.shape[1:]))
        v = self._v.new_empty((idx.numel(), *self._v.shape[1:]))
        k[:, :, : self._filled] = self._k[idx, :, : self._filled]
        v[:, :, : self._filled] = self._v[idx, :, : self._filled]
        self._k, self._v = k, v
        self._refresh()

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat every row ``repeats`` times in place (as ``DynamicLayer``)."""
        if self.is_initialized:
            rows = torch.arange(self._k.shape[0], device=self._k.device)
            self.batch_select_indices(rows.repeat_interleave(repeats))

    def crop(self, tokens_to_remove: int) -> None:
        """Forget the last ``-tokens_to_remove`` positions (a negative count, as ``DynamicLayer``)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of positions to remove, got {tokens_to_remove}")
        if self.is_initialized and tokens_to_remove:
            self._filled = max(0, self._filled + tokens_to_remove)
            self._refresh()

    def reset(self) -> None:
        """Forget every position (the buffers are dropped, as ``DynamicLayer`` does)."""
        self._k = self._v = None
        self._filled = 0
        super().reset()
