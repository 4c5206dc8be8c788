"""Seeded resource-allocation problems, an exact solver, a scorer and a tolerant allocation parser.

A problem has resources with integer capacities and tasks. Giving ``x_t`` units to task ``t`` earns
``value_t * x_t`` and uses ``demand_t[r] * x_t`` of every resource ``r``. Constraints:

* capacity: ``sum_t demand_t[r] * x_t <= capacity_r`` for every resource ``r``;
* bounds: ``min_units_t <= x_t <= max_units_t`` (``min_units_t`` is 0 unless the task is required);
* exclusion: for each exclusive pair ``(a, b)`` at most one of ``x_a``, ``x_b`` is positive.

The optimum is a bounded multi-dimensional integer knapsack; :func:`solve` finds it exactly by depth-first
branch and bound (the bound relaxes the other tasks' capacity interactions: each remaining task alone gets the
most units that still fit), so the optimum is exact, not approximate. Everything here is pure Python.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field

from marti.errors import InvalidArgumentError

RESOURCE_NAMES = ("cpu", "gpu", "memory", "storage", "bandwidth", "power")


@dataclass(frozen=True)
class ProblemSpec:
    """How :func:`generate` draws a problem.

    Args:
        num_resources: Resources (the first ``num_resources`` of :data:`RESOURCE_NAMES`).
        num_tasks: Tasks.
        max_units: Each task's maximum units is drawn uniformly from ``1..max_units``.
        num_required: Tasks that must get at least one unit.
        num_exclusive: Exclusive pairs (drawn among the tasks that are not required).
        demand: ``(low, high)``: each task's use of each resource per unit is drawn uniformly from
            ``low..high`` (a task that would use nothing gets ``max(low, 1)..high`` of one resource).
        values: ``(low, high)``: each task's value per unit is drawn uniformly from ``low..high``.
        capacity: ``"half"``: each capacity is about half of the resource's total maximum demand
            (``max(required use, ceil(total / 2), 1)``, so it follows from the tasks); ``"random"``: drawn
            uniformly from ``max(required use, 1)`` to ``max(total - 1, required use, 1)``, so it cannot be
            worked out from the tasks; ``"one"``: each capacity is what the required tasks need, at least 1 (with
            one unit of use per task and no required task: room for exactly one unit).
        max_capacity: With ``capacity="random"``, the draw's upper end is at most this (never below the required
            use); ``None``: no cap. ``private_allocation``'s ``pair`` level is ``easy`` with ``max_capacity=2``.
    """

    num_resources: int
    num_tasks: int
    max_units: int
    num_required: int = 0
    num_exclusive: int = 0
    demand: tuple[int, int] = (0, 4)
    values: tuple[int, int] = (1, 9)
    capacity: str = "half"
    max_capacity: int | None = None


#: The values of :attr:`ProblemSpec.capacity`.
CAPACITY_RULES = ("half", "random", "one")

#: difficulty -> spec of ``resource_allocation``'s problems.
DIFFICULTIES: dict[str, ProblemSpec] = {
    "easy": ProblemSpec(2, 3, 3),
    "medium": ProblemSpec(3, 5, 4, num_required=1, num_exclusive=1),
    "hard": ProblemSpec(4, 7, 5, num_required=2, num_exclusive=2),
}


@dataclass(frozen=True)
class Task:
    """One task of a problem.

    Args:
        name: ``task_<i>`` with ``i`` starting at 1.
        value: Value earned per unit (positive int).
        demand: Resource name -> amount used per unit (non-negative ints).
        max_units: Most units the task may get.
        min_units: Fewest units the task must get (0 unless required).
    """

    name: str
    value: int
    demand: dict[str, int]
    max_units: int
    min_units: int = 0


@dataclass(frozen=True)
class Problem:
    """A resource-allocation instance.

    Args:
        capacities: Resource name -> capacity, in declaration order.
        tasks: The tasks, in declaration order.
        exclusive: Pairs of task names of which at most one may get units.
    """

    capacities: dict[str, int]
    tasks: tuple[Task, ...]
    exclusive: tuple[tuple[str, str], ...] = ()

    @property
    def task_names(self) -> list[str]:
        """Task names in declaration order."""
        return [t.name for t in self.tasks]

    def to_dict(self, values: bool = True, constraints: bool = True) -> dict:
        """Return a JSON-ready description (used by the JSON observation format).

        Args:
            values: Include each task's ``value_per_unit``.
            constraints: Include the resources and their capacities, each task's ``demand_per_unit``,
                ``max_units`` and ``min_units``, and the exclusive pairs.

        Returns:
            ``{"tasks": [{"name": ..., ...}]}`` plus ``resources`` and ``exclusive_pairs`` when ``constraints``.
        """
        tasks = []
        for t in self.tasks:
            doc: dict = {"name": t.name}
            if values:
                doc["value_per_unit"] = t.value
            if constraints:
                doc.update(demand_per_unit=dict(t.demand), max_units=t.max_units, min_units=t.min_units)
            tasks.append(doc)
        if not constraints:
            return {"tasks": tasks}
        return {
            "resources": [{"name": r, "capacity": c} for r, c in self.capacities.items()],
            "tasks": tasks,
            "exclusive_pairs": [list(p) for p in self.exclusive],
        }


def generate(rng: random.Random, difficulty: str | ProblemSpec) -> Problem:
    """Draw a feasible problem.

    Args:
        rng: Source of randomness; the same state gives the same problem.
        difficulty: A :class:`ProblemSpec`, or the name of one of :data:`DIFFICULTIES`: ``easy`` (2 resources,
            3 tasks), ``medium`` (3, 5, one required task, one exclusive pair) or ``hard`` (4, 7, two required
            tasks, two exclusive pairs).

    Returns:
        A problem whose all-minimum allocation is feasible, with capacities drawn by the spec's ``capacity``
        rule (``half``, the named levels: about half of the total maximum demand, so that capacity binds).

    Raises:
        InvalidArgumentError: Unknown difficulty name, or a spec with too few tasks for its required tasks
            and exclusive pairs, or an unknown ``capacity`` rule.
    """
    if isinstance(difficulty, ProblemSpec):
        spec = difficulty
    elif difficulty in DIFFICULTIES:
        spec = DIFFICULTIES[difficulty]
    else:
        raise InvalidArgumentError(f"unknown difficulty {difficulty!r} (known: {', '.join(DIFFICULTIES)})")
    if spec.num_required + 2 * spec.num_exclusive > spec.num_tasks:
        raise InvalidArgumentError(f"{spec} has too few tasks for its required tasks and exclusive pairs")
    if spec.capacity not in CAPACITY_RULES:
        raise InvalidArgumentError(
            f"unknown capacity rule {spec.capacity!r} (known: {', '.join(CAPACITY_RULES)})"
        )
    n_res, n_tasks = spec.num_resources, spec.num_tasks
    d_lo, d_hi = spec.demand
    resources = RESOURCE_NAMES[:n_res]
    tasks = []
    for i in range(n_tasks):
        demand = {r: rng.randint(d_lo, d_hi) for r in resources}
        if not any(demand.values()):
            demand[resources[rng.randrange(n_res)]] = rng.randint(max(d_lo, 1), d_hi)
        tasks.append(Task(f"task_{i + 1}", rng.randint(*spec.values), demand, rng.randint(1, spec.max_units)))
    order = list(range(n_tasks))
    rng.shuffle(order)
    required = order[: spec.num_required]
    free = order[spec.num_required :]
    for i in required:
        t = tasks[i]
        tasks[i] = Task(t.name, t.value, t.demand, t.max_units, min_units=1)
    exclusive = []
    for k in range(spec.num_exclusive):
        a, b = sorted((free[2 * k], free[2 * k + 1]))
        exclusive.append((tasks[a].name, tasks[b].name))
    capacities = {}
    for r in resources:
        total = sum(t.demand[r] * t.max_units for t in tasks)
        need = sum(t.demand[r] * t.min_units for t in tasks)
        if spec.capacity == "one":
            capacities[r] = max(need, 1)
        elif spec.capacity == "random":
            high = max(total - 1, need, 1)
            if spec.max_capacity is not None:
                high = max(min(high, spec.max_capacity), need, 1)
            capacities[r] = rng.randint(max(need, 1), high)
        else:
            capacities[r] = max(need, (total + 1) // 2, 1)
    return Problem(capacities, tuple(tasks), tuple(exclusive))


def _value(problem: Problem, alloc: dict[str, int]) -> int:
    return sum(t.value * alloc.get(t.name, 0) for t in problem.tasks)


def solve(problem: Problem) -> tuple[int, dict[str, int]]:
    """Compute an optimal allocation exactly.

    Args:
        problem: The instance.

    Returns:
        ``(optimal_value, allocation)`` with ``allocation`` mapping every task name to its units. Ties are
        broken towards more units for earlier tasks (deterministic).
    """
    tasks = problem.tasks
    names = [t.name for t in tasks]
    excl = {n: set() for n in names}
    for a, b in problem.exclusive:
        excl[a].add(b)
        excl[b].add(a)
    best_value = -1
    best: list[int] = []
    units = [0] * len(tasks)
    remaining = dict(problem.capacities)

    def fit(t: Task) -> int:
        most = t.max_units
        for r, d in t.demand.items():
            if d:
                most = min(most, remaining[r] // d)
        return most

    def dfs(i: int, value: int) -> None:
        nonlocal best_value, best
        if i == len(tasks):
            if value > best_value:
                best_value, best = value, units.copy()
            return
        bound = value + sum(t.value * max(fit(t), 0) for t in tasks[i:])
        if bound <= best_value:
            return
        t = tasks[i]
        blocked = any(units[names.index(o)] > 0 for o in excl[t.name] if names.index(o) < i)
        hi = 0 if blocked else fit(t)
        for x in range(hi, t.min_units - 1, -1):
            for r, d in t.demand.items():
                remaining[r] -= d * x
            units[i] = x
            dfs(i + 1, value + t.value * x)
            for r, d in t.demand.items():
                remaining[r] += d * x
        units[i] = 0

    dfs(0, 0)
    if best_value < 0:
        # generate() guarantees feasibility; a hand-built infeasible problem has optimum 0 by convention.
        return 0, dict.fromkeys(names, 0)
    return best_value, dict(zip(names, best, strict=True))


@dataclass(frozen=True)
class Score:
    """How an allocation fares.

    Args:
        value: Total value of the allocation (counting every listed unit).
        violations: One human-readable line per broken constraint.
        used: Resource name -> amount used.
        utilization: Mean over resources of ``min(used / capacity, 1)`` (fraction, 0..1).
    """

    value: int
    violations: tuple[str, ...]
    used: dict[str, int] = field(default_factory=dict)
    utilization: float = 0.0

    @property
    def valid(self) -> bool:
        """True when no constraint is broken."""
        return not self.violations


def score(problem: Problem, alloc: dict[str, int], unknown: tuple[str, ...] = ()) -> Score:
    """Evaluate an allocation against a problem.

    Args:
        problem: The instance.
        alloc: Task name -> units; absent tasks get 0 units.
        unknown: Task names the agent used that the problem does not have (each is a violation).

    Returns:
        The :class:`Score`.
    """
    violations = [f"unknown task {u!r}" for u in unknown]
    used = dict.fromkeys(problem.capacities, 0)
    for t in problem.tasks:
        x = alloc.get(t.name, 0)
        for r, d in t.demand.items():
            used[r] += d * x
        if x > t.max_units:
            violations.append(f"{t.name} gets {x} units, above its maximum {t.max_units}")
        if x < t.min_units:
            violations.append(f"{t.name} gets {x} units, below its required minimum {t.min_units}")
    for r, cap in problem.capacities.items():
        if used[r] > cap:
            violations.append(f"{r} used {used[r]}, above its capacity {cap}")
    for a, b in problem.exclusive:
        if alloc.get(a, 0) > 0 and alloc.get(b, 0) > 0:
            violations.append(f"{a} and {b} both get units but are exclusive")
    caps = problem.capacities
    util = sum(min(used[r] / c, 1.0) for r, c in caps.items()) / len(caps) if caps else 0.0
    return Score(_value(problem, alloc), tuple(violations), used, util)


@dataclass(frozen=True)
class ParsedAllocation:
    """Result of reading an agent's allocation text.

    Args:
        allocation: Task name -> units, or ``None`` when nothing could be read.
        unknown: Task names mentioned that the problem does not have.
        error: Why parsing failed (``None`` on success), phrased as feedback to the agent.
        absent: True when the text holds nothing that looks like an allocation (no JSON object of amounts and
            no ``task_N: amount`` line), as opposed to an allocation with unusable amounts.
    """

    allocation: dict[str, int] | None
    unknown: tuple[str, ...] = ()
    error: str | None = None
    absent: bool = False


# A task named in text ("task_3", "Task #3", "task 3"), its number captured. Task numbers are ASCII digits, at most
# 9 of them (a longer number names no task of any problem; Python refuses int() of one over 4300 digits).
_TASK_ID = r"\btask[\s_#-]*(\d{1,9})\b"
_RE_FLAGS = re.IGNORECASE | re.ASCII
# A task id, then a separator (":", "=", "->", "gets", "receives"), then the amount: only spaces or markdown
# emphasis may stand between them. Text that restates the problem ("task_1: value 6 per unit, uses cpu 4") is
# not an allocation: an earlier, looser form read "value 6" as 6 units, which RL learned to exploit by copying
# the task list.
_LINE_RE = re.compile(
    _TASK_ID + r"[\s*]*(?::=|:|=|->|\bgets\b|\bget\b|\breceives\b)[\s*]*(-?\d+(?:\.\d+)?)", _RE_FLAGS
)
# A JSON key that names a task ("task_3", "3").
_KEY_RE = re.compile(r"^\s*(?:task)?[\s_#-]*(\d{1,9})\s*$", _RE_FLAGS)


def _amount(raw: object) -> int | None:
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw if raw >= 0 else None
    try:
        f = float(str(raw).strip())
    except ValueError:
        return None
    return int(f) if f.is_integer() and f >= 0 else None


def _from_pairs(pairs: list[tuple[str, object]], task_names: list[str]) -> ParsedAllocation:
    alloc: dict[str, int] = {}
    unknown: list[str] = []
    bad: list[str] = []
    for key, raw in pairs:
        m = _KEY_RE.match(str(key))
        name = f"task_{int(m.group(1))}" if m else str(key)
        amount = _amount(raw)
        if amount is None:
            bad.append(f"{name}: {raw!r}")
            continue
        if name not in task_names:
            unknown.append(name)
            continue
        alloc[name] = amount
    if bad:
        return ParsedAllocation(
            None, tuple(unknown), f"amounts must be whole numbers >= 0; could not use {', '.join(bad)}"
        )
    if not alloc and not unknown:
        return ParsedAllocation(None, (), "no task amounts found")
    return ParsedAllocation({n: alloc.get(n, 0) for n in task_names}, tuple(unknown))


def parse_allocation(text: str, task_names: list[str]) -> ParsedAllocation:
    """Read an allocation from free text.

    Accepted forms (case-insensitive; tasks not mentioned get 0 units; when a task appears twice the last
    mention wins):

    * a JSON object, ``{"task_1": 3, "task_2": 0}`` or ``{"allocation": {...}}``, anywhere in the text;
    * lines like ``task_1: 3``, ``task 1 = 3``, ``Task #1 -> 3 units``, ``task_1 gets 3``: the amount must
      follow the separator directly, so a restatement of the problem (``task_1: value 6 per unit``) is not
      read as an allocation.

    Args:
        text: The agent's message.
        task_names: The problem's task names (``task_1`` ...).

    Returns:
        A :class:`ParsedAllocation`; never raises on any text.
    """
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        try:
            obj = json.loads(text[start : end + 1])
        except (ValueError, RecursionError):
            obj = None
        if isinstance(obj, dict):
            inner = obj.get("allocation", obj)
            if isinstance(inner, dict) and inner:
                return _from_pairs(list(inner.items()), task_names)
    pairs = [(m.group(1), m.group(2)) for m in _LINE_RE.finditer(text)]
    if not pairs:
        return ParsedAllocation(
            None,
            (),
            "no allocation found; write one line per task like 'task_1: 2' or a JSON object",
            absent=True,
        )
    return _from_pairs(pairs, task_names)


_NAME_RE = re.compile(_TASK_ID, _RE_FLAGS)


def parse_names(text: str, task_names: list[str]) -> ParsedAllocation:
    """Read a submission that may name tasks instead of giving amounts (``private_allocation``'s ``pick``).

    Any form of :func:`parse_allocation` is read as such. A text that holds no allocation (``absent``) but names
    tasks gives **one unit to each task it names**: ``task_3`` and ``I pick task_3.`` mean ``{"task_3": 1}``;
    ``task_3, task_1`` means one unit to each of ``task_3`` and ``task_1`` (a name repeated counts once). A named
    task that the problem does not have is reported in ``unknown``, as :func:`parse_allocation` does.

    Args:
        text: The agent's message.
        task_names: The problem's task names (``task_1`` ...).

    Returns:
        A :class:`ParsedAllocation`; ``absent`` only when the text names no task; never raises on any text.
    """
    parsed = parse_allocation(text, task_names)
    if not parsed.absent:
        return parsed
    named = list(dict.fromkeys(int(m.group(1)) for m in _NAME_RE.finditer(text)))  # each name once, in order
    if not named:
        return ParsedAllocation(
            None, (), "no task named; name each task that gets one unit, like 'task_3'", absent=True
        )
    return _from_pairs([(str(n), 1) for n in named], task_names)


_SCORE_RE = re.compile(r"score\s*(?:is|=|:)?\s*(-?\d+(?:\.\d+)?)\s*(%|/\s*100|/\s*10\b)?", re.IGNORECASE)
_ACCEPT_RE = re.compile(r"\b(accept|accepted|approve|approved)\b", re.IGNORECASE)
_REJECT_RE = re.compile(r"\b(reject|rejected|not accept|don't accept|do not accept|revise)\b", re.IGNORECASE)


@dataclass(frozen=True)
class ParsedEvaluation:
    """Result of reading an evaluator's message.

    Args:
        score: The score as a fraction of the optimum, in ``[0, 1]``; ``None`` when absent or unusable.
        accept: Whether the message accepts the submission.
        error: Why the score is unusable (``None`` when it was read or absent), phrased as feedback.
    """

    score: float | None
    accept: bool
    error: str | None = None


def parse_evaluation(text: str) -> ParsedEvaluation:
    """Read an evaluator's message.

    Forms: ``score: 0.8`` (fraction of the optimum), ``score: 80%``, ``score: 8/10``, ``score = 80/100``, or
    JSON ``{"score": 0.8, "accept": true}``; ``accept``/``approve`` anywhere accepts unless ``reject``,
    ``revise`` or ``not accept`` also appear. A bare number is a fraction: ``score: 85`` or ``score: 1.5`` is
    outside ``[0, 1]``, as is ``score: 120%`` or ``score: -0.1``; such a score is an error, not clipped.

    Args:
        text: The evaluator's message.

    Returns:
        A :class:`ParsedEvaluation`; never raises on any text.
    """
    value: float | None = None
    written = ""
    accept = bool(_ACCEPT_RE.search(text)) and not _REJECT_RE.search(text)
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        try:
            obj = json.loads(text[start : end + 1])
        except (ValueError, RecursionError):
            obj = None
        if isinstance(obj, dict):
            raw = obj.get("score")
            if isinstance(raw, int | float) and not isinstance(raw, bool):
                value, written = float(raw), repr(raw)
            if isinstance(obj.get("accept"), bool):
                accept = obj["accept"]
    if value is None:
        m = _SCORE_RE.search(text)
        if m:
            value = float(m.group(1))
            unit = (m.group(2) or "").replace(" ", "")
            written = m.group(1) + unit
            if unit in ("%", "/100"):
                value /= 100.0
            elif unit == "/10":
                value /= 10.0
    if value is not None and not 0.0 <= value <= 1.0:
        return ParsedEvaluation(None, accept, f"score {written} is outside 0..1")
    return ParsedEvaluation(value, accept)
