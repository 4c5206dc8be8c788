"""A graded reward for `examples/data/pick_team.yaml`, as a user writes one (TRL-style, docs/datasets.md).

The verifier only says whether the executor named the best task. This function credits a reply the way the
env's own `pick` level does with the demo's settings (docs/environments.md: team score ``value / optimum`` of a
valid submission, plus ``role_weight 0.5`` for a valid one), from the row's ``values`` column, so a group of
samples that all miss the best task still learns which of them came closer.
"""

from __future__ import annotations

import re


def value_credit(
    prompts: list[str], completions: list[str], values: list[dict[str, int]], **columns: list
) -> list[float]:
    """Per reply: ``value / best value + 0.5`` when it names exactly one task (one unit fits the capacity),
    0.0 when it names several (over the capacity), -0.5 when it names none (unreadable).

    Args:
        prompts: The rows' prompts (unused).
        completions: The replies scored (the team's answer and each agent's own).
        values: Per reply, its row's ``values`` column (task name -> value).
        columns: The rows' other columns (unused).
    """
    out = []
    for text, vals in zip(completions, values, strict=True):
        named = list(dict.fromkeys(re.findall(r"task_\d+", text)))
        if not named:
            out.append(-0.5)
        elif len(named) > 1 or named[0] not in vals:
            out.append(0.0)
        else:
            out.append(vals[named[0]] / max(vals.values()) + 0.5)
    return out
