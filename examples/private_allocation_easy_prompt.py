"""The executor's prompt of examples/private_allocation_easy_count.yaml: its reply starts with its own capacity.

At ``easy`` played ranked, the executor observes its capacity ``k`` (``Resources: cpu capacity 3.``) and receives
the leader's order of the tasks; the team completes a problem when it names the leader's first ``k`` tasks. In the
runs recorded in docs/benchmarks.md ("The `easy` level played ranked") the executor learned to copy the leader's
order but never to cut it at ``k``: it settled on a constant count. This workflow writes the count into the start
of its reply, ``I can do {k} tasks: task_``, read from the executor's own observation (so nothing the executor
could not see is added); the reply start is a prompt token run, never trained. What is left to learn is the
teamwork: name the leader's first ``k`` tasks, in its order, and stop.
"""

from __future__ import annotations

import re

from marti.errors import InvalidArgumentError
from marti.team.workflow import PromptContext, TurnPrompt, default_build_prompt

_CAPACITY = re.compile(r"capacity (\d+)")


def capacity(observation: str) -> int:
    """The capacity ``k`` in an executor's observation (``Resources: cpu capacity 3.`` is 3).

    Raises:
        InvalidArgumentError: The observation states no capacity (not a ``private_allocation`` executor's).
    """
    found = _CAPACITY.search(observation)
    if found is None:
        raise InvalidArgumentError(f"no 'capacity N' in the executor's observation: {observation[:200]!r}")
    return int(found[1])


def executor_prompt(ctx: PromptContext) -> TurnPrompt:
    """The built-in user message (observation and teammates' messages), the reply started with the capacity.

    Args:
        ctx: The executor's turn context.

    Returns:
        ``TurnPrompt(default_build_prompt(ctx), reply_start=f"I can do {k} tasks: task_")``.

    Raises:
        InvalidArgumentError: From :func:`capacity`.
    """
    k = capacity(ctx.observation)
    return TurnPrompt(default_build_prompt(ctx), reply_start=f"I can do {k} tasks: task_")
