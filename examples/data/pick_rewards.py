"""A graded reward for `examples/data/pick_team.yaml`, as a user writes one (TRL-style, docs/datasets.md).

The verifier only says whether the executor named the best task; this credits a reply by the rank of the task
it names, the way the env's own `pick` level credits value over optimum, so a group of samples that all miss
the best task still learns which of them came closer.
"""

from __future__ import annotations

import re


def rank_credit(prompts: list[str], completions: list[str], ranking: list[list[str]], **columns) -> list[float]:
    """Per reply: ``1 - rank / len(ranking)`` for a reply that names exactly one task (the best task 1.0, the
    next 0.8, ... with five tasks), 0.0 for a reply naming several tasks (more than the capacity of one unit),
    and -0.5 for a reply naming none.

    Args:
        prompts: The rows' prompts (unused).
        completions: The replies scored (the team's answer and each agent's own).
        ranking: Per reply, its row's ``ranking`` column (task names, most valuable first).
        columns: The rows' other columns (unused).
    """
    out = []
    for text, order in zip(completions, ranking, strict=True):
        named = list(dict.fromkeys(re.findall(r"task_\d+", text)))
        if not named:
            out.append(-0.5)
        elif len(named) > 1 or named[0] not in order:
            out.append(0.0)
        else:
            out.append(1.0 - order.index(named[0]) / len(order))
    return out
