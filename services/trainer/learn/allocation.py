"""Priority-based allocation of the per-step training budget across agents (pure Python).

Priority of agent ``a`` (docs/workflows.md, "Priority allocation"):

    priority_a = w_p * progress_a + w_e * efficiency_a + w_u * urgency_a      (defaults 0.5, 0.3, 0.2)

* ``progress_a`` in [0, 1]: recent task progress, ``min(1, |mean R_a(recent half) - mean R_a(older half)| /
  (|mean R_a(older half)| + 1))`` over the last ``window`` steps of the agent's mean reward ``R_a`` (0 until two
  steps are known). An agent whose reward is still moving learns from more samples.
* ``efficiency_a`` in (0, 1]: resource efficiency, ``min_b c_b / c_a`` where ``c_a`` is the agent's mean
  response tokens per turn over the window (the cheapest agent is 1; 1 for all before any data).
* ``urgency_a`` in [0, 1]: how far the agent is behind, ``(max_b R_b - R_a) / (max_b R_b - min_b R_b)`` on the
  window means (0 when all agents are equal).

Shares: ``share_a = f + (1 - N f) * priority_a / sum_b priority_b`` with the floor ``f = min_share`` (equal
shares when every priority is 0), so every share is >= ``f`` and the shares sum to 1. The budget ``B`` (samples
per step; default: all collected) gives agent ``a`` a quota ``max(1, round(share_a * B))`` samples, capped at
what it collected; whole groups are kept so group advantages stay meaningful.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from marti.errors import InvalidArgumentError


@dataclass(frozen=True)
class AllocationWeights:
    """Weights and limits of the allocation (the ``allocation`` config section).

    Raises:
        InvalidArgumentError: A weight is negative, all are 0, ``min_share`` is outside [0, 1] or ``window < 2``.
    """

    progress: float = 0.5
    efficiency: float = 0.3
    urgency: float = 0.2
    min_share: float = 0.1
    window: int = 4

    def __post_init__(self) -> None:
        ws = (self.progress, self.efficiency, self.urgency)
        if min(ws) < 0 or sum(ws) <= 0:
            raise InvalidArgumentError(f"allocation weights must be >= 0 and not all 0, got {ws}")
        if not 0.0 <= self.min_share <= 1.0:
            raise InvalidArgumentError(f"allocation min_share must be in [0, 1], got {self.min_share}")
        if self.window < 1:
            raise InvalidArgumentError(f"allocation window must be >= 1, got {self.window}")


class PriorityAllocator:
    """Tracks each agent's reward and cost per step and turns them into budget shares.

    Args:
        agents: The agents that share the budget (the trainable ones), N of them.
        weights: :class:`AllocationWeights`.

    Raises:
        InvalidArgumentError: No agents, or ``N * min_share > 1`` (the floors alone exceed the budget).
    """

    def __init__(self, agents: Sequence[str], weights: AllocationWeights | None = None) -> None:
        self.agents = list(agents)
        self.w = weights or AllocationWeights()
        if not self.agents:
            raise InvalidArgumentError("priority allocation needs at least one agent")
        if len(self.agents) * self.w.min_share > 1 + 1e-12:
            raise InvalidArgumentError(
                f"min_share={self.w.min_share} times {len(self.agents)} agents exceeds the whole budget"
            )
        self._reward: dict[str, deque[float]] = {a: deque(maxlen=self.w.window) for a in self.agents}
        self._cost: dict[str, deque[float]] = {a: deque(maxlen=self.w.window) for a in self.agents}

    def observe(self, rewards: Mapping[str, float], tokens_per_turn: Mapping[str, float]) -> None:
        """Record one step: each agent's mean reward and mean response tokens per turn (agents absent are
        skipped)."""
        for a in self.agents:
            if a in rewards:
                self._reward[a].append(float(rewards[a]))
            if a in tokens_per_turn and tokens_per_turn[a] > 0:
                self._cost[a].append(float(tokens_per_turn[a]))

    def terms(self) -> dict[str, dict[str, float]]:
        """Per agent, ``{"progress", "efficiency", "urgency", "priority"}`` (see the module docstring)."""
        means = {a: _mean(self._reward[a]) for a in self.agents}
        known = [m for m in means.values() if m is not None]
        hi, lo = (max(known), min(known)) if known else (0.0, 0.0)
        costs = {a: _mean(self._cost[a]) for a in self.agents}
        cheapest = min((c for c in costs.values() if c), default=None)
        out: dict[str, dict[str, float]] = {}
        for a in self.agents:
            hist = list(self._reward[a])
            progress = 0.0
            if len(hist) >= 2:
                half = len(hist) // 2
                old, new = sum(hist[:half]) / half, sum(hist[half:]) / (len(hist) - half)
                progress = min(1.0, abs(new - old) / (abs(old) + 1.0))
            eff = 1.0 if cheapest is None or not costs[a] else cheapest / costs[a]
            m = means[a]
            urgency = 0.0 if m is None or hi == lo else (hi - m) / (hi - lo)
            prio = self.w.progress * progress + self.w.efficiency * eff + self.w.urgency * urgency
            out[a] = {"progress": progress, "efficiency": eff, "urgency": urgency, "priority": prio}
        return out

    def shares(self) -> dict[str, float]:
        """Per agent, its share of the budget: >= ``min_share``, summing to 1."""
        prio = {a: t["priority"] for a, t in self.terms().items()}
        return shares_from_priorities(prio, self.w.min_share)


def shares_from_priorities(priorities: Mapping[str, float], min_share: float) -> dict[str, float]:
    """``share_a = f + (1 - N f) * p_a / sum(p)`` (equal split of the rest when ``sum(p) == 0``).

    Raises:
        InvalidArgumentError: A priority is negative, or ``N * min_share > 1``.
    """
    n = len(priorities)
    if n == 0:
        return {}
    if n * min_share > 1 + 1e-12:
        raise InvalidArgumentError(f"min_share={min_share} times {n} agents exceeds the whole budget")
    bad = {a: p for a, p in priorities.items() if p < 0}
    if bad:
        raise InvalidArgumentError(f"priorities must be >= 0, got {bad}")
    total = sum(priorities.values())
    rest = 1.0 - n * min_share
    return {a: min_share + rest * (p / total if total > 0 else 1.0 / n) for a, p in priorities.items()}


def quotas(shares: Mapping[str, float], available: Mapping[str, int], budget: int | None) -> dict[str, int]:
    """Samples each agent trains on this step.

    Args:
        shares: Per agent, its share (sums to 1).
        available: Per agent, samples collected this step.
        budget: Samples per step across agents; None: ``sum(available)``.

    Returns:
        Per agent, ``min(available, max(1, round(share * budget)))`` (0 if it collected nothing).

    Raises:
        InvalidArgumentError: ``budget`` is given and < 1.
    """
    if budget is not None and budget < 1:
        raise InvalidArgumentError(f"allocation budget_samples must be >= 1, got {budget}")
    total = sum(available.values()) if budget is None else budget
    return {a: min(n, max(1, round(shares.get(a, 0.0) * total))) if n else 0 for a, n in available.items()}


def take_groups(samples: Sequence[Any], quota: int, group_of: Any = None, size_of: Any = None) -> list[Any]:
    """Keep whole groups of ``samples`` (in order of first appearance) until at least ``quota`` are kept.

    Args:
        samples: Items with a ``group`` attribute (or keyed by ``group_of(item)``).
        quota: Samples wanted, >= 0.
        group_of: Optional key function; default ``item.group``.
        size_of: Optional function giving the samples an item counts for (a trajectory: its trained turns);
            default 1 per item.

    Returns:
        A prefix of the groups, flattened in the original order; all items when ``quota`` is at least their
        total size.
    """
    size = size_of or (lambda s: 1)
    if quota >= sum(size(s) for s in samples):
        return list(samples)
    key = group_of or (lambda s: s.group)
    order: list[Any] = []
    by_group: dict[Any, list[Any]] = {}
    for s in samples:
        g = key(s)
        if g not in by_group:
            by_group[g] = []
            order.append(g)
        by_group[g].append(s)
    kept: set[Any] = set()
    count = 0
    for g in order:
        if count >= quota:
            break
        kept.add(g)
        count += sum(size(s) for s in by_group[g])
    return [s for s in samples if key(s) in kept]


def allocate_step(
    allocator: PriorityAllocator,
    batches: dict[str, list[Any]],
    metrics: Mapping[str, float],
    budget_samples: int | None,
) -> tuple[dict[str, list[Any]], dict[str, float]]:
    """Priority allocation of one step's training samples: ``allocator`` observes each agent's reward
    (``metrics["<agent>/reward"]``) and tokens per sample, and each agent's batch is cut to its quota of
    ``budget_samples``.

    Args:
        allocator: The job's allocator.
        batches: Each agent's taken rows (each with ``rows`` samples, ``tokens`` and a ``group``).
        metrics: The step's metrics so far.
        budget_samples: Samples for all agents together (None: every agent keeps what it took).

    Returns:
        The batches cut to each agent's quota of samples (trained turns; whole groups), and
        ``alloc/<agent>`` (share), ``alloc/<agent>/samples``,
        ``alloc/<agent>/{progress,efficiency,urgency,priority}``.
    """
    rewards = {a: metrics[f"{a}/reward"] for a in batches if f"{a}/reward" in metrics}
    rows = {a: sum(r.rows for r in ts) for a, ts in batches.items()}
    cost = {a: sum(r.tokens for r in ts) / rows[a] for a, ts in batches.items() if rows[a]}
    allocator.observe(rewards, cost)
    terms = allocator.terms()
    shares = allocator.shares()
    quota = quotas(shares, rows, budget_samples)
    out: dict[str, float] = {}
    cut: dict[str, list[Any]] = {}
    for a, ts in batches.items():
        cut[a] = take_groups(ts, quota.get(a, rows[a]), lambda r: r.group, lambda r: r.rows)
        out[f"alloc/{a}"] = shares.get(a, 0.0)
        out[f"alloc/{a}/samples"] = float(sum(r.rows for r in cut[a]))
        for k, v in terms.get(a, {}).items():
            out[f"alloc/{a}/{k}"] = v
    return cut, out


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None
