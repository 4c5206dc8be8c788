"""The reward of examples/private_allocation_easy.yaml: completion, and partial credit per task named right.

The env's dense reward pays a valid part of the optimum and penalises a capacity overshoot, so one name more than
the capacity costs more than several names fewer: on ``easy`` played ranked, the executor learned to name one
task, always valid and rarely complete; a reward for a total value near the optimum taught it to name four tasks
in task order, whatever the leader said (docs/benchmarks.md). Here each task named among the ``k`` most valuable
earns credit and each other task named loses as much, so within a group of samples of one problem the reward is
highest for the leader's first ``k`` tasks.

The problem is rebuilt from the episode's seed with :func:`marti.make` and read from the agents' observations (the
leader's order and the executor's capacity), as an agent of the team would see them. Names are read as the env
reads them (``Task_01`` is ``task_1``) since a review after run 5 of docs/benchmarks.md, which read only
lower-case ``task_N``.
"""

from __future__ import annotations

import re

import marti
from marti.workflow import EpisodeView

#: Weight of the partial credit (a completed episode gets 1).
PARTIAL = 0.5
#: The env of examples/private_allocation_easy.yaml.
ENV = {"scenario": "private_allocation", "difficulty": "easy", "ranked": True, "num_agents": 2}
_NAME = re.compile(r"task_(\d+)", re.IGNORECASE)


def _names(text: str) -> list[str]:
    """The task names in ``text`` as the env reads them (``Task_01`` is ``task_1``), in order."""
    return [f"task_{int(n)}" for n in _NAME.findall(text)]


def best_tasks(seed: int) -> list[str]:
    """The ``k`` most valuable tasks of the problem of ``seed``: the first ``k`` of the leader's order, ``k`` the
    executor's capacity, both read from the agents' first observations."""
    env = marti.make("collaborative_task_solving", seed=seed, **ENV)
    obs, _ = env.reset(seed=seed)
    env.close()
    order = _names(obs["agent_1"].split("most valuable first:")[1])
    k = int(re.search(r"cpu capacity (\d+)", obs["agent_2"]).group(1))
    return order[:k]


def per_task_credit(episode: EpisodeView) -> dict[str, float]:
    """1.0 to every agent when the team completed the problem, else
    ``PARTIAL * max(0, (right - wrong) / k)``.

    ``right`` counts the distinct tasks the executor named that are among the ``k`` most valuable, ``wrong`` the
    others it named (the last executor reply of the transcript). Tasks of equal value are ranked as the leader's
    order ranks them (task order), so naming a task that ties with the ``k``-th is partial credit lost, although
    the env completes such a submission (and the reward then is 1).

    Args:
        episode: The finished episode.

    Returns:
        Agent -> reward in [0, 1], the same for every agent.
    """
    if episode.metrics.get("task_completion", 0.0) >= 1.0:
        return dict.fromkeys(episode.agents, 1.0)
    executor = [a for a, i in episode.final_infos.items() if i.get("role") == "executor"]
    replies = [text for _, agent, text in episode.transcript if agent in executor]
    if not replies:
        return dict.fromkeys(episode.agents, 0.0)
    best = set(best_tasks(episode.seed))
    named = set(_names(replies[-1]))
    score = (len(named & best) - len(named - best)) / len(best)
    return dict.fromkeys(episode.agents, PARTIAL * max(0.0, score))
