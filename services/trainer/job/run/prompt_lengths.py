"""A dataset job's prompt lengths, checked before the run folder (:func:`check_prompt_lengths`): a row whose first
prompt leaves no room for the reply in the rollout engine's length was found only mid-run, by the engine, naming a
position in a generation batch. (In any job, a reply length that leaves no room for a prompt at all:
:func:`~services.trainer.job.run.reply_lengths.check_reply_lengths`.)

An agent's first prompt in the ``dataset_task`` env is its system prompt
(:func:`~services.trainer.rollout.episodes.runner.role_system_prompt`) and the text of the row's column it sees
(``environment.options.agent_inputs``, else ``dataset.input_key``), rendered with the agent's chat template as the
rollout renders it (:func:`~services.trainer.rollout.engines.base.chats_to_ids`), plus its ``response_prefix``.
Later turns add the teammates' messages, which no check before the job can know.
"""

from __future__ import annotations

import sys
from typing import Any

from marti.config import TrainConfig
from marti.config.sections.dataset import DATASET_ENV
from marti.data import ProblemSet
from marti.errors import InvalidArgumentError
from marti.team.workflow import Workflow, workflow_from_section
from services.trainer.data.tasks import DatasetTasks
from services.trainer.job.run.reply_lengths import reply_length, reply_limit
from services.trainer.models.loading import load_tokenizer
from services.trainer.rollout.engines.base import chats_to_ids
from services.trainer.rollout.episodes.runner import agent_system_prompt, role_system_prompt

BATCH = 256
"""Rows rendered and tokenised per ``apply_chat_template`` call."""
SAY_ROWS = 20_000
"""From this many rows (training plus held-out) the check says on stderr what it is doing before it starts: it
renders every row's chat template per agent (300,000 short rows took 65 s, 2026-12-06, with nothing shown)."""


def check_prompt_lengths(cfg: TrainConfig, tasks: DatasetTasks) -> None:
    """Check that every agent's first prompt of every row (training and held-out) plus the agent's
    ``max_new_tokens`` fits the rollout engine's length (see the module docstring). Only for the ``dataset_task``
    env; with a ``workflow`` section, its roles' ``system_prompt`` templates are the system prompts, and an agent
    whose role is scripted or has its own ``prompt_builder`` is not checked (nor is any agent of a
    ``workflow.factory``). Each model's tokenizer is loaded once (the job loads it anyway). Every turn's prompt
    of a checked agent starts with what is checked (the env shows the row's text every turn).

    Raises:
        InvalidArgumentError: The first row whose prompt does not fit, naming the row (its 0-based position and
            ``FILE:LINE``, as every dataset error does: :meth:`marti.data.ProblemSet.where`), the file, the agent, the prompt's token count, the limit and
            where it comes from, and the config key of the reply's ``max_new_tokens``.
        NotFoundError: A model or its tokenizer cannot be found locally.
    """
    if cfg.environment.env_name != DATASET_ENV or (cfg.workflow.active and cfg.workflow.factory):
        return
    names = [a.name for a in cfg.agents]
    workflow = workflow_from_section(cfg.workflow, names, cfg) if cfg.workflow.active else Workflow.env()
    inputs = cfg.environment.options.get("agent_inputs") or {}
    total = sum(len(ps) for ps in (tasks.problems.train, tasks.problems.eval) if ps is not None)
    if total >= SAY_ROWS:
        print(
            f"checking that the first prompt of each of the {total} rows fits the rollout engine, for each of the "
            f"{len(cfg.agents)} agents (Ctrl-C stops cleanly) ...", file=sys.stderr, flush=True,
        )  # fmt: skip
    tokenizers: dict[str, Any] = {}
    for index, agent in enumerate(cfg.agents):
        role = workflow.role(agent.name)
        if role.policy is not None or role.build_prompt is not None:
            continue  # a scripted agent, or one whose role builds its own prompt
        if agent.pretrain_model not in tokenizers:
            tokenizers[agent.pretrain_model] = load_tokenizer(agent.pretrain_model)
        tok = tokenizers[agent.pretrain_model]
        limit, limit_from = reply_limit(cfg, index)
        reply, reply_key = reply_length(cfg, index)
        prefix = (
            len(tok(agent.response_prefix, add_special_tokens=False)["input_ids"])
            if agent.response_prefix
            else 0
        )
        system = role_system_prompt(
            role, agent_system_prompt(agent), agent.role, ", ".join(agent.capabilities)
        )
        for ps in (tasks.problems.train, tasks.problems.eval):
            if ps is None:
                continue
            column = inputs.get(agent.name, ps.input_key)
            for start in range(0, len(ps), BATCH):
                rows = range(start, min(start + BATCH, len(ps)))
                chats = [_chat(system, ps.row(i)[column]) for i in rows]
                for i, ids in zip(rows, chats_to_ids(tok, chats), strict=True):
                    if len(ids) + prefix + reply > limit:
                        raise _too_long(
                            ps, i, agent.name, column, len(ids) + prefix, limit, limit_from, reply, reply_key
                        )


def _chat(system: str, text: Any) -> list[dict[str, str]]:
    """The first prompt of an agent: its system prompt, and the row's text as the env's observation."""
    return [{"role": "system", "content": system}, {"role": "user", "content": str(text)}]


def _too_long(
    ps: ProblemSet, i: int, agent: str, column: str, n: int, limit: int, limit_from: str, reply: int, key: str
) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"{ps.where(i)} of dataset {ps.source}: agent {agent!r}'s first prompt (its system prompt and the "
        f"row's {column!r} text, in its chat template) is {n} tokens; with {key} {reply} for its reply that is "
        f"{n + reply} tokens, beyond the {limit} the rollout engine takes ({limit_from}): shorten or drop the "
        f"row, or lower {key}"
    )
