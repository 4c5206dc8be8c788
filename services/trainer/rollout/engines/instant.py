"""A model-free rollout engine that answers at once: for measuring what serves it, not for training.

:class:`InstantRolloutEngine` has no model and no weights. Each response is ``max_new_tokens`` token ids taken in
turn from a fixed English text (:data:`ANSWER_TEXT`, encoded once per agent with its tokenizer), starting at an
offset that depends only on the prompt, so the same prompt always gets the same response; its text is decoded and
cut at a stop string exactly as the transformers engine does (:func:`~services.trainer.rollout.engines.hf.trim_at_stop`).
Every token's log-probability is 0.0 (the engine is deterministic: each token has probability 1).

It is what ``marti bench gateway`` serves its model-free arms from (through the gateway's ordinary
:class:`~services.trainer.rollout.serving.gateway_backend.EngineBackend`, tokenizers and chat templates included), so the
time a request spends in the gateway, its adapters and its clients is measured apart from any model's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from marti.errors import InvalidArgumentError
from services.trainer.rollout.engines.base import (
    Generation,
    Prompt,
    RolloutEngine,
    SamplingParams,
    check_room,
    normalise_prompts,
)
from services.trainer.rollout.engines.hf import trim_at_stop

#: The text responses are drawn from (its token ids, in turn).
ANSWER_TEXT = (
    "Red, orange and yellow are three colours of the rainbow; green, blue, indigo and violet are the other four. "
    "Light bends by a different angle for each wavelength as it enters and leaves a drop of water."
)


class InstantRolloutEngine(RolloutEngine):
    """Answers every prompt at once with deterministic token ids and no model (see the module docstring).

    Args:
        tokenizers: agent -> its tokenizer (encodes :data:`ANSWER_TEXT`, decodes responses, applies chat
            templates to chat prompts).
        max_model_len: Most prompt-plus-response tokens accepted, > 0.

    Raises:
        InvalidArgumentError: No agents, or ``max_model_len`` not positive.
    """

    def __init__(self, tokenizers: Mapping[str, Any], *, max_model_len: int = 2048) -> None:
        super().__init__(list(tokenizers))
        if not isinstance(max_model_len, int) or max_model_len <= 0:
            raise InvalidArgumentError(f"max_model_len must be an int > 0, got {max_model_len!r}")
        self._tokenizers = dict(tokenizers)
        self._max_model_len = max_model_len
        self._answers = {
            a: list(tok(ANSWER_TEXT, add_special_tokens=False)["input_ids"]) for a, tok in tokenizers.items()
        }

    def max_model_len(self, agent_id: str) -> int:
        """The most prompt-plus-response tokens accepted (the constructor's ``max_model_len``)."""
        self._check_agent(agent_id)
        return self._max_model_len

    def generate(
        self, agent_id: str, prompts: Sequence[Prompt], sampling: SamplingParams | None = None
    ) -> list[Generation]:
        """One response of ``max_new_tokens`` ids per prompt (fewer when a stop string ends it), at once.

        Raises:
            NotFoundError: Unknown agent.
            InvalidArgumentError: An empty prompt, or a prompt plus ``max_new_tokens`` beyond ``max_model_len``.
        """
        self._check_agent(agent_id)
        params = sampling or self.sampling_for(agent_id)
        tok = self._tokenizers[agent_id]
        answer = self._answers[agent_id]
        out = []
        all_ids = normalise_prompts(tok, prompts, len(tok))
        check_room(all_ids, params.max_new_tokens, self._max_model_len)
        for ids in all_ids:
            start = sum(ids) % len(answer)
            toks = [answer[(start + i) % len(answer)] for i in range(params.max_new_tokens)]
            end, reason, text = trim_at_stop(tok, toks, False, params)
            out.append(
                Generation(
                    prompt_token_ids=ids,
                    response_token_ids=toks[:end],
                    response_logprobs=[0.0] * end,
                    text=text,
                    finish_reason=reason,  # type: ignore[arg-type]
                    policy_version=self._versions[agent_id],
                    agent_id=agent_id,
                )
            )
        return out

    def update_weights(self, agent_id: str, weights: Mapping[str, torch.Tensor], policy_version: int) -> None:
        """Move the agent to ``policy_version``; the engine has no weights, so ``weights`` must be empty.

        Raises:
            NotFoundError: Unknown agent.
            InvalidArgumentError: ``weights`` is not empty (there is nothing to load them into).
            FailedPreconditionError: ``policy_version`` is older than the current one.
        """
        self._check_version(agent_id, policy_version)
        if weights:
            raise InvalidArgumentError(
                f"the instant engine has no weights: got {len(weights)} tensors for agent {agent_id!r}"
            )
        self._versions[agent_id] = policy_version
