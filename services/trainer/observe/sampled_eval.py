"""Metrics of a sampled evaluation (``rollout.eval_samples`` N > 1): each held-out problem played N times.

* ``team/pass@k`` for k = 1..N: the mean over problems of the unbiased estimator of Chen et al. 2021
  ("Evaluating Large Language Models Trained on Code", eq. 1), ``1 - C(n - c, k) / C(n, k)`` with ``n`` samples of
  which ``c`` solved the problem: the chance that at least one of k samples drawn without replacement solves it.
* ``team/majority_vote``: per problem, the most common team answer among its samples (normalised with
  :func:`marti.rewards.answers.normalize_text`; a tie goes to the answer sampled first) counts as solved when a
  sample with that answer solved it; averaged over the problems whose episodes carry a team answer (the
  ``dataset_task`` env's ``team_answer``). Episodes without one (other envs) give no majority vote.

An episode solved its problem when its ``task_completion`` metric is at least 1.
"""

from __future__ import annotations

from collections import Counter
from math import comb

from marti.errors import InvalidArgumentError
from marti.rewards.answers import normalize_text
from services.trainer.observe.episode_metrics import episode_metrics, task_metrics
from services.trainer.rollout.episodes.runner import EpisodeResult

__all__ = ["eval_metrics", "majority_solved", "pass_at_k", "sampled_metrics"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate of one problem (Chen et al. 2021, eq. 1): ``1 - C(n-c, k) / C(n, k)``.

    Args:
        n: Samples drawn, >= 1.
        c: Samples that solved the problem, 0..n.
        k: Samples the estimate is for, 1..n.

    Raises:
        InvalidArgumentError: ``n < 1``, ``c`` outside ``0..n`` or ``k`` outside ``1..n``.
    """
    if n < 1 or not 0 <= c <= n or not 1 <= k <= n:
        raise InvalidArgumentError(f"pass@k needs n >= 1, 0 <= c <= n, 1 <= k <= n; got n={n}, c={c}, k={k}")
    return 1.0 - comb(n - c, k) / comb(n, k)


def majority_solved(samples: list[tuple[str, bool]]) -> bool:
    """Whether the majority answer of one problem's samples ``(team answer, solved)`` solved it (see the module
    docstring; an empty answer is a vote like any other).

    Raises:
        InvalidArgumentError: ``samples`` is empty.
    """
    if not samples:
        raise InvalidArgumentError("majority_solved needs at least one sample")
    keys = [normalize_text(answer) for answer, _ in samples]
    counts = Counter(keys)
    best = max(counts.values())
    winner = next(k for k in keys if counts[k] == best)
    return any(solved for key, (_, solved) in zip(keys, samples, strict=True) if key == winner)


def _solved(result: EpisodeResult) -> bool:
    return result.metrics.get("task_completion", 0.0) >= 1.0


def sampled_metrics(results: list[EpisodeResult], samples: int) -> dict[str, float]:
    """``team/pass@k`` (k = 1..``samples``) and ``team/majority_vote`` of a sampled evaluation.

    Args:
        results: The evaluation's episodes: each problem (``task``, ``seed``) played ``samples`` times.
        samples: N, the episodes per problem (``rollout.eval_samples``), >= 2.

    Returns:
        The metrics, or ``{}`` without episodes.

    Raises:
        InvalidArgumentError: ``samples < 2``, or a problem played other than ``samples`` times.
    """
    if samples < 2:
        raise InvalidArgumentError(f"a sampled evaluation needs samples >= 2, got {samples}")
    problems: dict[tuple[str | None, int], list[EpisodeResult]] = {}
    for r in results:
        problems.setdefault((r.task, r.seed), []).append(r)
    if not problems:
        return {}
    for key, eps in problems.items():
        if len(eps) != samples:
            raise InvalidArgumentError(
                f"problem {key} was played {len(eps)} times, not eval_samples={samples}"
            )
    out = {}
    for k in range(1, samples + 1):
        vals = [pass_at_k(samples, sum(map(_solved, eps)), k) for eps in problems.values()]
        out[f"team/pass@{k}"] = sum(vals) / len(vals)
    voted = [eps for eps in problems.values() if all(r.team_answer is not None for r in eps)]
    if voted:
        wins = [majority_solved([(str(r.team_answer), _solved(r)) for r in eps]) for eps in voted]
        out["team/majority_vote"] = sum(wins) / len(wins)
    return out


def eval_metrics(results: list[EpisodeResult], samples: int) -> dict[str, float]:
    """An evaluation's metrics: :func:`episode_metrics` and :func:`task_metrics` of its episodes, plus
    :func:`sampled_metrics` when each problem was played ``samples`` > 1 times.

    Args:
        results: The evaluation's episodes.
        samples: Episodes per problem (``rollout.eval_samples``), >= 1.

    Raises:
        InvalidArgumentError: As :func:`sampled_metrics`, when ``samples`` > 1.
    """
    metrics = {**episode_metrics(results), **task_metrics(results)}
    if samples > 1:
        metrics.update(sampled_metrics(results, samples))
    return metrics
