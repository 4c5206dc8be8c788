"""Shared-prompt computation: run a prompt that several rows of a batch repeat through the model once.

Group-based RL (GRPO, RLOO, REINFORCE++ with a group baseline) samples G responses per prompt, so a batch of
B = P x G rows holds only P distinct prompts. A plain forward pays for every prompt token G times, in the
rollout's prefill and again in every training forward and backward. Here the distinct prompts run once, with a
key/value cache, the cache rows are gathered to the B rows (an index select, differentiable), and only the
responses run per row. The numbers are those of the plain forward up to float rounding (the rows see the same
keys and values at the same positions; with dropout active, the rows of a group share the prompt's dropout
mask, where the plain forward draws one per row), and gradients flow into the shared prompt's computation from
every row that reads it. vLLM's automatic prefix caching gives the rollout half of this on GPU; this module gives it
to transformers on any device, and to the training forward, which no cache shares.

Layout (the learner's :func:`services.trainer.learn.experience.collate` and the transformers rollout engine): prompts
left-padded to a common width, so rows with an equal prompt have equal ids and equal attention mask over the
first ``prefix_len`` columns. Rows are matched exactly on those columns. In the training forward
(:func:`response_logits`), every prompt's padding is first moved after its tokens but the last
(:func:`prompts_first`: the same function, as positions follow the attention mask), so prompts that start alike
do so in the same columns whatever their lengths; then rows whose prompts start alike (a chain's later agent: one
observation per group, then a teammate's message that differs per row) share those first columns when that runs
fewer tokens than sharing whole prompts (:func:`shared_prefix_len`). The transformers rollout engine prefills the same way
(:func:`prefill_for_generation`), and so does the static-cache engine's eager loop. Padding moves only in a model
whose every layer is full attention with rotary positions (:func:`moves_padding`: a sliding window or an ALiBi
bias counts columns, not positions); a model with layers whose cache is not keys and values (a convolution, a
recurrence) shares nothing (:func:`can_share`).

Shapes: B rows, U distinct prompts (U <= B), T tokens, A response (action) tokens, V vocabulary.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from services.trainer.models.training_attention import checkpointed


def shared_prefix_rows(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, prefix_len: int
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Find rows whose first ``prefix_len`` columns (ids and mask) are equal.

    Args:
        input_ids: (B, T) int64.
        attention_mask: (B, T) 0/1.
        prefix_len: Columns compared, in [1, T].

    Returns:
        ``(first, inverse)``: ``first`` (U,) int64, the first row holding each distinct prefix, in order of first
        appearance; ``inverse`` (B,) int64, for every row the position in ``first`` of its prefix. ``None`` when
        all B prefixes differ (nothing to share) or ``prefix_len`` is outside [1, T].
    """
    rows, width = input_ids.shape
    if rows < 2 or not 1 <= prefix_len <= width:
        return None
    key = torch.cat([input_ids[:, :prefix_len], attention_mask[:, :prefix_len].to(input_ids.dtype)], dim=1)
    _, inverse = torch.unique(key.cpu(), dim=0, return_inverse=True)  # sorted order; renumbered below
    if int(inverse.max()) + 1 == rows:
        return None
    first_of_sorted = torch.full((int(inverse.max()) + 1,), rows, dtype=torch.long)
    first_of_sorted.scatter_reduce_(0, inverse, torch.arange(rows), reduce="amin")
    order = torch.argsort(first_of_sorted)  # distinct prefixes by first appearance
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel())
    return first_of_sorted[order], rank[inverse]


def shared_prefix_len(input_ids: torch.Tensor, attention_mask: torch.Tensor, width: int) -> int | None:
    """How many leading columns the training forward computes once per distinct value.

    For every row, the longest run of leading columns (ids and mask, at most ``width``) it has in common with
    some earlier row; of those lengths P, the one that runs the fewest tokens, ``U(P) * P + B * (T - P)`` (U(P)
    distinct heads of P columns, then every row's T - P other columns), against ``B * T`` for the plain forward.
    A whole prompt (P = ``width``) that some rows repeat is shared whatever it saves, as
    :func:`shared_prefix_rows` finds it; a shorter head only when it runs at most 3/4 of the plain tokens.

    Args:
        input_ids: (B, T) int64.
        attention_mask: (B, T) 0/1.
        width: The most leading columns shared, in [1, T]: the prompt width (T - A in a training forward).

    Returns:
        P in [1, ``width``], or ``None`` when nothing is worth sharing.
    """
    rows, num_tokens = input_ids.shape
    if rows < 2 or not 1 <= width <= num_tokens:
        return None
    key = torch.stack([input_ids[:, :width], attention_mask[:, :width].to(input_ids.dtype)], dim=-1).cpu()
    common = [0]  # row 0 shares with no earlier row
    for i in range(1, rows):  # leading columns row i has in common with each earlier row
        run = (key[:i] == key[i]).all(dim=-1).to(torch.int8).cumprod(dim=1).sum(dim=1)
        common.append(int(run.max()))
    best, best_cost = None, None
    for head in sorted(set(common) - {0}):
        distinct = sum(1 for c in common if c < head)  # rows that start a new head of this length
        cost = distinct * head + rows * (num_tokens - head)
        if (head == width or cost <= 0.75 * rows * num_tokens) and (best_cost is None or cost <= best_cost):
            best, best_cost = head, cost
    return best


class PrefixLayout(NamedTuple):
    """What a training forward runs once (:func:`prefix_layout`).

    Attributes:
        input_ids: (B, T) int64, the rows to compute, prompts first (:func:`prompts_first`) unless asked not to.
        attention_mask: (B, T) 0/1, likewise.
        head: P, the leading columns run once per distinct value, in [1, T - A].
        first: (U,) int64, the first row holding each distinct head (:func:`shared_prefix_rows`).
        inverse: (B,) int64, every row's position in ``first``.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    head: int
    first: torch.Tensor
    inverse: torch.Tensor


def prompts_first(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every row with its prompt's padding moved after the prompt's tokens but its last: ``(input_ids,
    attention_mask)``, the first ``width - 1`` columns of each row reordered (its tokens in their order, then its
    padding columns), the others as they were (column ``width - 1``, the prompt's last token under left padding,
    predicts the first response token). A forward whose positions follow the attention mask (:func:`position_ids`)
    and whose causal mask follows the columns computes the same function of the columns after the padding: each
    token keeps its position and sees the same tokens. The inputs themselves when no prompt has padding there.

    Args:
        input_ids: (B, T) int64.
        attention_mask: (B, T) 0/1.
        width: The prompt width, in [1, T]: T - A in a training forward, T in generation.
    """
    head = width - 1
    pads = attention_mask[:, :head] == 0
    if not bool(pads.any()):
        return input_ids, attention_mask
    order = torch.argsort(pads.to(torch.int8), dim=1, stable=True)  # tokens in order, then the padding
    ids = torch.cat([input_ids[:, :head].gather(1, order), input_ids[:, head:]], dim=1)
    mask = torch.cat([attention_mask[:, :head].gather(1, order), attention_mask[:, head:]], dim=1)
    return ids, mask


def prefix_layout(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    width: int,
    most: int | None = None,
    *,
    move_padding: bool = True,
) -> PrefixLayout | None:
    """What a forward runs once: the rows with their prompts first (:func:`prompts_first`), the leading columns
    :func:`shared_prefix_len` chooses on them and the rows that hold their distinct values
    (:func:`shared_prefix_rows`); None when nothing is worth sharing.

    Args:
        input_ids: (B, T) int64.
        attention_mask: (B, T) 0/1.
        width: The prompt width, in [1, T]: T - A in a training forward, T in generation.
        most: The most leading columns shared, in [1, width]; default ``width``.
        move_padding: Move the prompts' padding first; False keeps every column where it is (a model that
            :func:`moves_padding` refuses).
    """
    if move_padding:
        input_ids, attention_mask = prompts_first(input_ids, attention_mask, width)
    head = shared_prefix_len(input_ids, attention_mask, width if most is None else most)
    shared = shared_prefix_rows(input_ids, attention_mask, head) if head is not None else None
    return None if shared is None else PrefixLayout(input_ids, attention_mask, head, *shared)


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, as ``generate`` computes them: ``cumsum(mask) - 1`` clipped at 0."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def prefill_shared(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prefix_len: int,
    first: torch.Tensor,
    inverse: torch.Tensor,
) -> tuple[Any, torch.Tensor]:
    """Run the U distinct prefixes once and gather their key/value cache to all B rows.

    Args:
        model: A transformers causal LM (or a peft model around one) whose forward takes ``cache``.
        input_ids: (B, T) int64, on the model's device.
        attention_mask: (B, T) 0/1, on the model's device.
        prefix_len: Columns that form the shared prefix, in [1, T].
        first: (U,) rows to compute, from :func:`shared_prefix_rows`.
        inverse: (B,) row -> distinct prefix, from :func:`shared_prefix_rows`.

    Returns:
        ``(cache, last_logits)``: a transformers ``Cache`` over ``prefix_len`` positions with B rows, and (B, V)
        the logits at the prefix's last position (they predict column ``prefix_len``). Gradients flow through
        both when grad is enabled.
    """
    from transformers import DynamicCache

    device = input_ids.device
    first, inverse = first.to(device), inverse.to(device)
    ids = input_ids[first, :prefix_len]
    mask = attention_mask[first, :prefix_len]
    out = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=position_ids(mask),
        cache=DynamicCache(),
        use_cache=True,
        logits_to_keep=1,
    )
    cache = out.cache
    select_cache_rows(cache, inverse)
    return cache, out.logits[:, -1].index_select(0, inverse)


def prefill_for_generation(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, Any] | None:
    """The key/value cache of every row's prompt but its last column, computing what rows share once: the
    distinct heads :func:`prefix_layout` chooses (whole prompts, or a shorter head when that runs fewer tokens),
    then every row's columns after its head on their cache.

    Args:
        model: A transformers causal LM (or a peft model around one) that returns a cache (:func:`can_share`).
        input_ids: (B, W) int64 left-padded prompts, on the model's device.
        attention_mask: (B, W) 0/1.

    Returns:
        ``(input_ids, attention_mask, cache)``: the rows as ``generate`` must be given them with this cache (their
        padding moved where :func:`moves_padding`, :func:`prompts_first`; the same function of the prompts), and a
        transformers ``Cache`` of their first W - 1 columns; None when nothing is worth sharing (or W < 2).
    """
    width = input_ids.shape[1]
    layout = None
    if width >= 2:
        layout = prefix_layout(
            input_ids, attention_mask, width, most=width - 1, move_padding=moves_padding(model)
        )
    if layout is None:
        return None
    input_ids, attention_mask, head, first, inverse = layout
    cache, _ = prefill_shared(model, input_ids, attention_mask, head, first, inverse)
    if head < width - 1:  # every row's prompt columns after its head, on the head's cache
        model(
            input_ids=input_ids[:, head : width - 1],
            attention_mask=attention_mask[:, : width - 1],
            position_ids=position_ids(attention_mask)[:, head : width - 1],
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
    return input_ids, attention_mask, cache


def select_cache_rows(cache: Any, rows: torch.Tensor) -> None:
    """Keep (and repeat) the cache's batch rows ``rows``, in place: every layer's keys and values become
    ``index_select(0, rows)`` of what they were.

    transformers' ``Cache.batch_select_indices`` selects with ``tensor[rows]``, whose backward (``index_put_`` with
    accumulation) adds the rows that read one prompt in an order that varies from call to call on the CPU when
    many rows repeat one index (a GRPO group): the same batch then gives gradients that differ in the last bits,
    and a seeded run drifts. ``index_select``'s backward (``index_add_``) adds them in a fixed order.

    Args:
        cache: A transformers ``DynamicCache`` (its ``layers`` hold ``keys`` and ``values``, (B, H, T, D)).
        rows: (B',) int64 row indices, on the cache's device.
    """
    for layer in cache.layers:
        if getattr(layer, "keys", None) is not None and layer.keys.numel() > 0:
            layer.keys = layer.keys.index_select(0, rows)
            layer.values = layer.values.index_select(0, rows)


SHARED_LAYER_TYPES = ("full_attention", "sliding_attention")
"""transformers layer types whose cache is keys and values over columns, which :func:`select_cache_rows` gathers."""


def layer_types(model: torch.nn.Module) -> list[str]:
    """transformers' type of every decoder layer of ``model`` (or of the model a peft wrapper holds), as its cache
    is built (``full_attention``, ``sliding_attention``, ``conv``, ``linear_attention``, ...); empty when
    ``model`` has no transformers config or transformers cannot tell."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "get_text_config"):
        return []
    try:
        from transformers.cache_utils import get_layer_types_and_kwargs

        return list(get_layer_types_and_kwargs(config.get_text_config(decoder=True))[0])
    except (ImportError, AttributeError, KeyError, TypeError):
        return []


def can_share(model: torch.nn.Module) -> bool:
    """Whether ``model`` can run a shared prefix: it must return a cache, which gradient checkpointing forbids,
    whose every layer holds keys and values (:data:`SHARED_LAYER_TYPES`: a convolution's or a recurrence's state
    is neither gathered to rows nor split at a column)."""
    types = layer_types(model)
    return bool(types) and all(t in SHARED_LAYER_TYPES for t in types) and not checkpointed(model)


def moves_padding(model: torch.nn.Module) -> bool:
    """Whether moving a prompt's padding (:func:`prompts_first`) keeps ``model``'s function: every layer is full
    attention and positions enter as rotary angles (its config has ``rope_parameters`` or ``rope_theta``), which
    follow the ``position_ids`` given. A sliding window counts columns, not positions (padding moved between a prompt's
    tokens would push its first tokens out of the window of the last ones), and so does a bias by column distance
    (MPT's ALiBi); other models keep their columns (learned absolute positions would do, but are not told apart
    from column biases here)."""
    types = layer_types(model)
    if not types or any(t != "full_attention" for t in types):
        return False
    config = model.config.get_text_config(decoder=True)
    return bool(getattr(config, "rope_parameters", None) or getattr(config, "rope_theta", None))


def response_logits(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    num_actions: int,
    *,
    share: bool = True,
) -> torch.Tensor:
    """Logits that predict the last A tokens of every row, computing each distinct prompt once.

    Equal, up to float rounding, to ``model(input_ids, attention_mask, position_ids, logits_to_keep=A + 1)
    .logits[:, :-1]``: position ``T - A - 1 + j`` predicts token ``T - A + j``. When rows repeat a prompt (the
    first ``T - A`` columns) and ``share`` is on, the distinct prompts run once through the model with a cache
    and only the responses run per row (:func:`prefill_shared`); when rows' prompts start alike (their padding
    moved after their tokens, :func:`prompts_first`) and sharing that head runs fewer tokens
    (:func:`shared_prefix_len`), the distinct heads run once and the rest of every row after them; otherwise, or
    when the model cannot return a cache (:func:`can_share`), it is that plain forward.

    Args:
        model: A transformers causal LM (or a peft model around one).
        input_ids: (B, T) int64, on the model's device.
        attention_mask: (B, T) 0/1, on the model's device.
        num_actions: A, in [1, T).
        share: Allow the shared-prompt path.

    Returns:
        (B, A, V) logits in the model's dtype, with grad when grad is enabled.
    """
    num_tokens = input_ids.shape[1]
    prefix_len = num_tokens - num_actions
    layout = None
    if share and can_share(model):
        layout = prefix_layout(input_ids, attention_mask, prefix_len, move_padding=moves_padding(model))
    if layout is not None:
        input_ids, attention_mask, head, first, inverse = layout
    else:
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids(attention_mask),
            logits_to_keep=num_actions + 1,
            use_cache=False,
        )
        return out.logits[:, :-1]
    if head < prefix_len:
        return _head_shared_logits(model, input_ids, attention_mask, num_actions, head, first, inverse)
    cache, first_logits = prefill_shared(model, input_ids, attention_mask, head, first, inverse)
    first_logits = first_logits.unsqueeze(1)  # (B, 1, V): predicts column T - A
    if num_actions == 1:
        return first_logits
    # the response tokens that predict another response token
    rest = _forward_after(model, input_ids, attention_mask, cache, prefix_len)
    return torch.cat([first_logits, rest], dim=1)


def _head_shared_logits(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    num_actions: int,
    head: int,
    first: torch.Tensor,
    inverse: torch.Tensor,
) -> torch.Tensor:
    """:func:`response_logits` with the first ``head`` columns (shorter than the prompt) run once per distinct
    value (the rows ``first``, ``inverse`` of :func:`prefix_layout`): (B, A, V) logits, those of the plain forward
    up to float rounding."""
    cache, _ = prefill_shared(model, input_ids, attention_mask, head, first, inverse)
    # the rest of the prompt and the responses but the last token
    return _forward_after(model, input_ids, attention_mask, cache, head, logits_to_keep=num_actions)


def _forward_after(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    cache: Any,
    start: int,
    logits_to_keep: int = 0,
) -> torch.Tensor:
    """Run columns ``[start, T - 1)`` of every row on ``cache`` (which holds columns ``[0, start)``): their
    (B, T - 1 - start, V) logits, or only the last ``logits_to_keep`` of them (0: all)."""
    rest = slice(start, input_ids.shape[1] - 1)
    out = model(
        input_ids=input_ids[:, rest],
        attention_mask=attention_mask[:, : input_ids.shape[1] - 1],
        position_ids=position_ids(attention_mask)[:, rest],
        cache=cache,
        use_cache=True,
        logits_to_keep=logits_to_keep,
    )
    return out.logits
