"""The ``reward:`` section of the training config: rewards of dataset problems scored in the trainer by user reward
functions (TRL's ``reward_funcs``), a remote reward server (OpenRLHF's ``--remote_rm_url``) and a reward model
(OpenRLHF's ``--reward_pretrain`` / ``--reward_model``) on its own Ray actor (docs/datasets.md).

Without any of them a dataset job's rewards are the ``dataset_task`` env's verifier scores. With one or more, every
configured scorer scores the team's final answer and each agent's own last answer, the scores are summed
(functions weighted by ``function_weights``), and they replace the verifier's rewards (the verifier still gives
the accuracy metrics).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from marti.config.section import Section
from marti.rewards.judge import JUDGE_PATTERN, JUDGE_PATTERN_TIMEOUT_S, compile_judge_pattern

_Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]

#: A scorer's key -> the keys only that scorer reads: set to other than their defaults without it they would do
#: nothing, so they are refused.
_READ_ONLY_WITH = {
    "remote_url": ("remote_timeout_s", "remote_retries", "remote_backoff_s", "remote_batch_size"),
    "model": ("model_batch_size", "model_max_length"),
    "judge_agent": ("judge_pattern", "judge_pattern_timeout_s"),
}


class RewardConfig(Section):
    """Reward scorers of dataset problems, run in the trainer (docs/datasets.md)."""

    functions: list[str] = Field(default_factory=list)
    """User reward functions, ``file.py:fn`` or ``module:fn``, each called TRL-style
    ``fn(prompts=..., completions=..., **columns) -> list[float]`` (one float per completion)."""
    function_weights: list[Annotated[float, Field(allow_inf_nan=False)]] | None = None
    """One weight per function (TRL's ``reward_weights``); null: 1.0 each."""
    remote_url: str | None = None
    """A remote reward server (OpenRLHF's ``--remote_rm_url`` protocol: POST ``{query, prompts, labels}``,
    answer ``{rewards}``); ``labels`` are the ``dataset.label_key`` column (``""`` when it is null)."""
    remote_timeout_s: _Positive = 60.0
    """Seconds each request to the remote server may wait (connect, and between bytes)."""
    remote_retries: Annotated[int, Field(ge=0)] = 3
    """Further attempts after a connection error, a timeout or a 5xx answer."""
    remote_backoff_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 1.0
    """Seconds before the first retry, doubled before each next one."""
    remote_batch_size: Annotated[int, Field(ge=1)] = 64
    """Completions per request to the remote server."""
    model: str | None = None
    """A reward model: a local folder holding an ``AutoModelForSequenceClassification`` with one output label
    and its tokenizer, or the alias ``tiny-llama`` (a tiny random one, for tests); it runs on its own Ray
    actor. ``algorithm.normalize_reward`` normalises its scores like any reward."""
    model_batch_size: Annotated[int, Field(ge=1)] = 8
    """Texts per forward pass of the reward model."""
    model_max_length: Annotated[int, Field(ge=1)] = 2048
    """Tokens of ``prompt + completion`` the reward model reads (its last ones)."""
    judge_agent: str | None = None
    """An LLM judge: a frozen agent of the team (``is_tuning: false``) that speaks last; the verdict read from its
    last reply is the team answer's reward (docs/datasets.md, "An LLM judge"). Not combined with the other
    scorers. Null: no judge."""
    judge_pattern: str = JUDGE_PATTERN
    """Regex reading the judge's verdict (its last match; group 1 if any): a number in [0, 1], or ``correct`` /
    ``yes`` (1) / ``incorrect`` / ``no`` (0). An unreadable verdict scores 0 with a warning (``judge/unreadable``).
    Checked to compile at config load."""
    judge_pattern_timeout_s: _Positive = JUDGE_PATTERN_TIMEOUT_S
    """Seconds ``judge_pattern`` may run on one judge reply (the ``regex`` package's ``timeout``); past it (a
    pattern that backtracks catastrophically) the verdict is unreadable: scored 0 with a warning naming the
    pattern and the limit, counted in ``judge/unreadable``, and the job goes on."""

    @property
    def active(self) -> bool:
        """True when any scorer is configured."""
        return bool(self.functions or self.remote_url or self.model or self.judge_agent)

    @model_validator(mode="after")
    def _check_weights(self) -> RewardConfig:
        if self.function_weights is not None and len(self.function_weights) != len(self.functions):
            raise ValueError(
                f"reward.function_weights has {len(self.function_weights)} weights for "
                f"{len(self.functions)} reward.functions"
            )
        if self.judge_agent and (self.functions or self.remote_url or self.model):
            raise ValueError(
                f"reward.judge_agent {self.judge_agent!r}: the judge's verdict is the reward; leave out "
                "reward.functions, remote_url and model"
            )
        compile_judge_pattern(self.judge_pattern)
        for owner, keys in _READ_ONLY_WITH.items():
            unread = [k for k in keys if getattr(self, k) != type(self).model_fields[k].default]
            if unread and not getattr(self, owner):
                raise ValueError(
                    f"reward.{unread[0]} is set but reward.{owner} is not: only the {owner} scorer reads it, so it "
                    f"would do nothing; set reward.{owner} or remove reward.{unread[0]}"
                )
        return self
