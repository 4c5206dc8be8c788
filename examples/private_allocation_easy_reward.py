"""The reward of examples/private_allocation_easy.yaml: completion, and partial credit per task named right.

The env's dense reward pays a valid part of the optimum and penalises a capacity overshoot, so one name more than
the capacity costs more than several names fewer: on ``easy`` played ranked, the executor learned to name one
task, always valid and rarely complete; a reward for a total value near the optimum taught it to name four tasks
in task order, whatever the leader said (docs/benchmarks.md). Here each task named among the ``k`` most valuable
earns credit and each other task named loses as much, so within a group of samples of one problem the reward is
highest for the leader's first ``k`` tasks.

The problem is rebuilt from the episode's seed with :func:`marti.make` and read from the leader's observations (its
order of the tasks, and the values it would see unranked), as an agent of the team would see them; ``k`` is the
number of best tasks whose values add up to the episode's optimum (``optimal_value`` in the env's final infos), so
the same reward serves every ranked level, ``pick`` (k = 1), ``pair`` (1..2) and ``easy`` (1..4), also in a
curriculum where the level of an episode changes during the run (the tasks of a seed are the same at every level).
Names are read as the env reads them (``Task_01`` is ``task_1``) since a review after run 5 of
docs/benchmarks.md, which read only lower-case ``task_N``.
"""

from __future__ import annotations

import re

import marti
from marti.errors import InvalidArgumentError
from marti.team.workflow import EpisodeView

#: Weight of the partial credit (a completed episode gets 1).
PARTIAL = 0.5
#: The env of examples/private_allocation_easy.yaml; the tasks of a seed are the same at every ranked level.
ENV = {"scenario": "private_allocation", "difficulty": "easy", "num_agents": 2}
_NAME = re.compile(r"task_(\d+)", re.IGNORECASE)
_VALUE = re.compile(r"(task_\d+): value (\d+) per unit")


def _names(text: str) -> list[str]:
    """The task names in ``text`` as the env reads them (``Task_01`` is ``task_1``), in order."""
    return [f"task_{int(n)}" for n in _NAME.findall(text)]


def _leader_view(seed: int, ranked: bool) -> str:
    env = marti.make("collaborative_task_solving", seed=seed, ranked=ranked, **ENV)
    obs, _ = env.reset(seed=seed)
    env.close()
    return obs["agent_1"]


def best_tasks(seed: int, optimal_value: float) -> list[str]:
    """The ``k`` most valuable tasks of the problem of ``seed``: the first ``k`` of the leader's order, ``k`` the
    number of them whose values add up to ``optimal_value`` (the capacity: every task takes one unit).

    Raises:
        InvalidArgumentError: No prefix of the order adds up to ``optimal_value`` (not a ranked level's episode).
    """
    order = _names(_leader_view(seed, ranked=True).split("most valuable first:")[1])
    values = {name: int(v) for name, v in _VALUE.findall(_leader_view(seed, ranked=False))}
    total = 0
    for k, name in enumerate(order, start=1):
        total += values[name]
        if total == optimal_value:
            return order[:k]
    raise InvalidArgumentError(
        f"seed {seed}: no first tasks of {order} add up to the optimum {optimal_value}"
    )


def per_task_credit(episode: EpisodeView) -> dict[str, float]:
    """1.0 to every agent when the team completed the problem, else
    ``PARTIAL * max(0, (right - wrong) / k)``.

    ``right`` counts the distinct tasks the executor named that are among the ``k`` most valuable
    (:func:`best_tasks`), ``wrong`` the others it named (the last executor reply of the transcript). Tasks of
    equal value are ranked as the leader's order ranks them (task order), so naming a task that ties with the ``k``-th is partial credit lost, although
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
    best = set(best_tasks(episode.seed, next(iter(episode.final_infos.values()))["optimal_value"]))
    named = set(_names(replies[-1]))
    score = (len(named & best) - len(named - best)) / len(best)
    return dict.fromkeys(episode.agents, PARTIAL * max(0.0, score))


def completion(episode: EpisodeView) -> dict[str, float]:
    """1.0 to every agent when the team completed the problem, else 0.0 (no partial credit).

    The reward of examples/private_allocation_easy_count.yaml, where the executor's reply starts with its
    capacity: :func:`per_task_credit` there paid naming all five tasks in task order (most of the credit when
    ``k`` is 3 or 4), which the executor learned instead of the leader's order (docs/benchmarks.md).

    Args:
        episode: The finished episode.

    Returns:
        Agent -> 1.0 or 0.0, the same for every agent.
    """
    done = episode.metrics.get("task_completion", 0.0) >= 1.0
    return dict.fromkeys(episode.agents, 1.0 if done else 0.0)
