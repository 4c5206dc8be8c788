"""Critics for PPO with GAE: a value head on a transformer backbone, one critic per trainable agent.

``V(s_t)`` for each response token is read from the hidden state at the position *before* that token, the same
alignment as :meth:`services.trainer.models.policy.MultiAgentPolicy.logprobs` (the state in which the token was
chosen), as in OpenRLHF's ``CriticModel`` (``values[:, -A-1:-1]``). The head starts at zero so initial values
are 0 and early advantages equal the discounted rewards.

Shapes: B batch, T tokens, A response tokens (the last A positions of T), H hidden size.
"""

from __future__ import annotations

import torch
from torch import nn

from marti.errors import InvalidArgumentError
from services.trainer.models.loading import load_model, load_tokenizer


class ValueModel(nn.Module):
    """A causal-LM backbone (without its LM head) and a scalar value head.

    Args:
        backbone: The base transformer returning ``last_hidden_state`` (e.g. ``LlamaModel``).
        hidden_size: H, the backbone's hidden size.
    """

    def __init__(self, backbone: nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, num_actions: int
    ) -> torch.Tensor:
        """Values of the last ``num_actions`` tokens.

        Args:
            input_ids: (B, T) int64.
            attention_mask: (B, T) 0/1 (left padding allowed; positions follow the mask).
            num_actions: A, with 1 <= A < T.

        Returns:
            (B, A) float32 values.

        Raises:
            InvalidArgumentError: A outside [1, T).
        """
        T = input_ids.shape[1]
        if not 1 <= num_actions < T:
            raise InvalidArgumentError(f"num_actions A={num_actions} must be in [1, T={T})")
        device = self.value_head.weight.device
        mask = attention_mask.to(device)
        position_ids = (mask.long().cumsum(-1) - 1).clamp(min=0)
        hidden = self.backbone(
            input_ids=input_ids.to(device), attention_mask=mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state  # (B, T, H)
        return self.value_head(hidden[:, -num_actions - 1 : -1]).squeeze(-1).float()


def build_critic(
    model_name: str,
    *,
    seed: int = 0,
    device: str | torch.device = "cpu",
    attn_implementation: str | None = None,
    init_device: str | torch.device = "cpu",
    disable_dropout: bool = False,
) -> ValueModel:
    """Load ``model_name`` (any name :func:`services.trainer.models.loading.load_model` accepts) as a critic.

    Args:
        model_name: The critic's base model (by default the agent's ``pretrain_model``).
        seed: Seed for tiny models.
        device: Where the critic lives.
        attn_implementation: transformers attention kernel (``policy.attn_implementation``); None: default.
        init_device: Where the backbone's weights are created (``strategy.init_on_gpu``); moved to ``device``
            after.
        disable_dropout: Set the backbone's dropout probabilities to 0 (``policy.disable_dropout``).

    Returns:
        A trainable :class:`ValueModel` (every backbone weight and the head train).

    Raises:
        NotFoundError: the model is not available locally (named).
    """
    tokenizer = load_tokenizer(model_name)
    lm = load_model(
        model_name,
        tokenizer=tokenizer,
        seed=seed,
        attn_implementation=attn_implementation,
        device=init_device,
        disable_dropout=disable_dropout,
    )
    backbone = getattr(lm, lm.base_model_prefix, None)
    if backbone is None:
        raise InvalidArgumentError(f"model {model_name!r} has no backbone attribute {lm.base_model_prefix!r}")
    critic = ValueModel(backbone, int(lm.config.hidden_size)).to(device)
    critic.train()
    return critic
