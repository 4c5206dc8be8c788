"""The reward of examples/private_allocation_easy.yaml: completion, and partial credit for a submission's total
value near the optimum from either side.

The env's dense reward pays a valid part of the optimum and penalises a capacity overshoot, so one name more than
the capacity costs more than several names fewer: on ``easy`` played ranked, the executor learned to name one
task, always valid and rarely complete (docs/benchmarks.md). Here naming one task too many costs about as much as
one too few, so within a group of samples of one problem the reward peaks at the capacity's count of names.
"""

from __future__ import annotations

from marti.workflow import EpisodeView

#: Weight of the partial credit (a completed episode gets 1).
PARTIAL = 0.5


def near_optimum(episode: EpisodeView) -> dict[str, float]:
    """1.0 to every agent when the team completed the problem, else ``PARTIAL * max(0, 1 - |v - v*| / v*)``.

    ``v`` is the executor's submitted total value (``allocated_value`` in its last info, counted also when the
    submission breaks the capacity) and ``v*`` the optimum (``optimal_value``); an episode without a readable
    submission gets 0.

    Args:
        episode: The finished episode.

    Returns:
        Agent -> reward in [0, 1], the same for every agent.
    """
    if episode.metrics.get("task_completion", 0.0) >= 1.0:
        return dict.fromkeys(episode.agents, 1.0)
    infos = [
        i for i in episode.final_infos.values() if i.get("role") == "executor" and "allocated_value" in i
    ]
    best = infos[0].get("optimal_value") if infos else None
    if not infos or not best:
        return dict.fromkeys(episode.agents, 0.0)
    closeness = max(0.0, 1.0 - abs(float(infos[0]["allocated_value"]) - float(best)) / float(best))
    return dict.fromkeys(episode.agents, PARTIAL * closeness)
