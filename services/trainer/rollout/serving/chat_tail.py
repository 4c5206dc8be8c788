"""The token ids a chat template renders after an assistant turn: what the gateway appends to a reply's exact ids
when the next prompt carries that reply back (see :mod:`services.gateway.core.transcript`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from services.trainer.rollout.engines.base import special_texts


def _render(tokenizer: Any, messages: Sequence[Mapping[str, Any]], tools: Any, generation: bool) -> str:
    kwargs = {"tools": list(tools)} if tools else {}
    return str(
        tokenizer.apply_chat_template(
            list(messages), add_generation_prompt=generation, tokenize=False, **kwargs
        )
    )


def end_of_turn_text(tokenizer: Any, end_id: int) -> str | None:
    """The text of ``end_id`` when it is one of the tokenizer's special tokens (``<|im_end|>``, ``<|eot_id|>``:
    a reply that ended its turn), else None (a reply cut by ``max_tokens`` or a stop string)."""
    specials = set(getattr(tokenizer, "all_special_ids", ()) or ())
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    token = added.get(end_id)
    if end_id not in specials and not (token is not None and getattr(token, "special", False)):
        return None
    text = tokenizer.convert_ids_to_tokens(int(end_id))
    return text if isinstance(text, str) and text else None


def chat_tail_ids(
    tokenizer: Any, messages: Sequence[Mapping[str, Any]], k: int, end_id: int, tools: Any = None
) -> list[int] | None:
    """The ids the chat template renders after assistant message ``k`` ends: from just after the end-of-turn
    token ``end_id`` that closed the model's reply (the last token it generated, ``<|im_end|>``) to the end of
    the generation prompt that follows the last message.

    The template is rendered twice as text, over all messages with the generation prompt and over
    ``messages[:k + 1]`` without; the first must extend the second (templates that rewrite earlier turns once
    more follow, e.g. by dropping reasoning, do not), and the tail is tokenised as the template's own text.

    Args:
        tokenizer: A transformers tokenizer with a chat template.
        messages: The conversation (chat-template dicts), ``messages[k]`` an assistant message.
        k: Index of the assistant message whose exact ids the caller has.
        end_id: The last token id of that reply.
        tools: Tool specs passed to the template (None: no tools).

    Returns:
        The tail's token ids, or None when it cannot be cut exactly: ``end_id`` is not a special token (the
        reply did not end its turn), the renderings do not extend each other, its text is not in the rendering of
        message ``k``, a later message holds the text of a special
        token (it must be tokenised as plain text, which a whole-prompt render does), or the template fails.
    """
    end_text = end_of_turn_text(tokenizer, end_id)
    if end_text is None or not 0 <= k < len(messages):
        return None
    specials = special_texts(tokenizer)
    for m in messages[k + 1 :]:
        content = m.get("content")
        if isinstance(content, str) and any(s in content for s in specials):
            return None
    try:
        full = _render(tokenizer, messages, tools, True)
        base = _render(tokenizer, messages[: k + 1], tools, False)
    except Exception:  # noqa: BLE001 - a template that cannot render the cut: the caller renders it whole
        return None
    at = base.rfind(end_text)
    if at < 0 or not full.startswith(base):
        return None
    tail = base[at + len(end_text) :] + full[len(base) :]
    if not tail:
        return []
    return [int(t) for t in tokenizer(tail, add_special_tokens=False)["input_ids"]]
