"""The verifiable single-turn task of ``marti bench trainer``: reply with the sum of two numbers.

Shared, unchanged, by both sides of the benchmark (our GRPO in the project's virtualenv and TRL's GRPOTrainer in
its own virtualenv), so it imports only the standard library at module level; :func:`evaluate` imports torch
lazily and uses nothing but ``transformers`` ``generate``, which both virtualenvs hold at the same version.
"""

from __future__ import annotations

import random
import re
from typing import Any

#: Reward of a reply whose first integer is the right sum.
CORRECT_REWARD = 1.0
#: Partial credit: the reply holds an integer, but not the right one.
NUMBER_REWARD = 0.1
_INT_RE = re.compile(r"-?\d+")


def make_problems(seed: int, count: int, max_operand: int = 50) -> list[dict[str, Any]]:
    """Draw ``count`` addition problems with a seeded RNG.

    Args:
        seed: RNG seed; equal seeds give equal problems.
        count: Number of problems, >= 0.
        max_operand: Operands are drawn uniformly from ``[0, max_operand]``, >= 0.

    Returns:
        ``count`` dicts ``{"question": str, "answer": int}``.

    Raises:
        ValueError: ``count`` or ``max_operand`` negative.
    """
    if count < 0 or max_operand < 0:
        raise ValueError(f"count ({count}) and max_operand ({max_operand}) must be >= 0")
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        out.append({"question": f"What is {a} + {b}? Reply with only the number.", "answer": a + b})
    return out


def chat(question: str) -> list[dict[str, str]]:
    """The prompt as a one-message chat conversation (the chat template is applied by each side)."""
    return [{"role": "user", "content": question}]


def reward(text: str, answer: int) -> float:
    """Score a reply.

    Args:
        text: The model's reply.
        answer: The right sum.

    Returns:
        :data:`CORRECT_REWARD` if the first integer in ``text`` equals ``answer``, :data:`NUMBER_REWARD` if the
        text holds another integer first, 0.0 if it holds none.
    """
    m = _INT_RE.search(text)
    if m is None:
        return 0.0
    return CORRECT_REWARD if int(m.group()) == answer else NUMBER_REWARD


def evaluate(
    model: Any, tokenizer: Any, problems: list[dict[str, Any]], max_new_tokens: int
) -> dict[str, float]:
    """Greedy-decode every problem with ``model`` and score the replies (same code for both sides).

    Args:
        model: A transformers causal LM (or a peft model).
        tokenizer: Its tokenizer (chat template).
        problems: From :func:`make_problems`.
        max_new_tokens: Most tokens per reply.

    Returns:
        ``{"reward": mean reward, "accuracy": fraction exactly right, "has_number": fraction with an integer,
        "scores": every problem's reward, in order}``.
    """
    import torch

    tokenizer.padding_side = "left"
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    prompts = [
        tokenizer.apply_chat_template(chat(p["question"]), add_generation_prompt=True, tokenize=False)
        for p in problems
    ]
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        out = model.generate(
            **enc,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad,
            temperature=None,
            top_p=None,
        )
    model.train(was_training)
    texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    scores = [reward(t, p["answer"]) for t, p in zip(texts, problems, strict=True)]
    n = max(1, len(scores))
    return {
        "reward": sum(scores) / n,
        "accuracy": sum(s == CORRECT_REWARD for s in scores) / n,
        "has_number": sum(s > 0 for s in scores) / n,
        "scores": scores,
    }
