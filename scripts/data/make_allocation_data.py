"""Write allocation problems as a dataset file, for dataset jobs (docs/datasets.md).

Two kinds of rows, both from the env server's own problem generator (the same problem for the same seed):

* ``--kind pick`` (JSONL): private_allocation's ``pick`` level as a team task. ``leader_view`` is what the leader
  observes (the tasks' order by value), ``prompt`` what the executor observes (the resource and the limits), and
  ``answer`` the one task a correct submission names (the most valuable). A team solves a row only when the
  leader tells the executor the order: ``examples/data/pick_team.yaml`` trains on it. The rows are distinct
  problems: no two show the agents the same text. What they see is the executor's prompt (the same on every
  ``pick`` problem) and the leader's order of the five tasks, so there are :data:`PICK_PROBLEMS` (5! = 120) of
  them; a ``--count`` above that writes all 120 and says so (a held-out split of a file with repeated problems
  would score recall of trained rows as generalisation).
* ``--kind resource_allocation`` (a JSON list): resource_allocation problems at a difficulty, ``prompt`` the whole
  problem and a question, ``answer`` the highest total value a valid allocation reaches (the exact optimum), for
  the ``numeric`` verifier; ``data/multi_agent_resource_allocation.json`` of the design's launch script.

Usage::

    python scripts/data/make_allocation_data.py --kind pick --count 120 --out data/private_allocation_pick.jsonl
    python scripts/data/make_allocation_data.py --kind resource_allocation --difficulty easy \\
        --out data/multi_agent_resource_allocation.json
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script from a clone
    sys.path.insert(0, str(ROOT))

import marti  # noqa: E402
from scripts.data.output import write_out  # noqa: E402
from services.env_server.envs import allocation_problem as ap  # noqa: E402
from services.env_server.envs.private_allocation import PRIVATE_DIFFICULTIES  # noqa: E402

#: The leader's ranking line; its first task is the answer.
_RANKING = re.compile(r"Tasks, most valuable first: [^.\n]*")

#: Distinct ``pick`` problems: the orders of its tasks (any order is drawn, equal values keep task order).
PICK_PROBLEMS = math.factorial(PRIVATE_DIFFICULTIES["pick"].num_tasks)

#: Seeds :func:`balanced_pick_rows` tries before it gives up (all 120 problems are drawn by seed ~1,000).
_MAX_SEEDS = 100_000


def pick_row(seed: int) -> dict[str, object]:
    """One ``pick`` problem (seed ``seed``) as a row: ``prompt``, ``leader_view``, ``answer``, ``ranking``,
    ``values``, ``solo_view``, ``seed``."""
    env = marti.make(
        "collaborative_task_solving", scenario="private_allocation", difficulty="pick", num_agents=2,
        roles=["planner", "executor"], max_turns=2, history_messages=0, seed=seed,
    )  # fmt: skip
    leader, _ = env.reset(seed=seed)
    # the executor's observation on its own turn (after a leader message), as the env shows it to the demo's team
    executor, *_ = env.step({"agent_1": "Most valuable first: see above", "agent_2": ""})
    obs = {"agent_1": leader["agent_1"], "agent_2": executor["agent_2"]}
    env.close()
    solo = marti.make(
        "collaborative_task_solving", scenario="private_allocation", difficulty="pick", num_agents=1,
        roles=["executor"], solo_view="all", max_turns=1, history_messages=0, seed=seed,
    )  # fmt: skip
    solo_view = solo.reset(seed=seed)[0]["agent_1"]  # one agent that sees the whole problem
    solo.close()
    ranking = re.findall(r"task_\d+", _RANKING.search(obs["agent_1"]).group(0))  # most valuable first
    problem = ap.generate(random.Random(seed), PRIVATE_DIFFICULTIES["pick"])  # the env's draw for this seed
    values = {t.name: t.value for t in problem.tasks}
    assert max(values, key=values.__getitem__) == ranking[0], seed  # the same problem as the env's
    return {"prompt": obs["agent_2"], "leader_view": obs["agent_1"], "answer": ranking[0],
            "ranking": ranking, "values": values, "solo_view": solo_view, "seed": seed}  # fmt: skip


def balanced_pick_rows(count: int, start_seed: int) -> list[dict[str, object]]:
    """``count`` distinct pick problems (at most :data:`PICK_PROBLEMS`) from seeds ``start_seed, +1, ...``,
    skipping a seed whose problem is already a row (the same ``prompt`` and ``leader_view``) or whose answer
    already has its share, so that every task is the answer of ``count / 5`` rows (give or take one): the
    generator's own draws favour some tasks, and on skewed rows a constant answer scores well above the 1 in 5 it
    scores here. Each task is the answer of 24 of the 120 problems, so every count up to 120 can be balanced.

    Raises:
        ValueError: ``count`` is outside ``1..PICK_PROBLEMS``, or the seeds up to ``start_seed + 100000`` do not
            hold that many problems.
    """
    if not 1 <= count <= PICK_PROBLEMS:
        raise ValueError(f"count must be in 1..{PICK_PROBLEMS} (the distinct pick problems), got {count}")
    rows: list[dict[str, object]] = []
    seen: set[tuple[object, object]] = set()
    per_answer: dict[object, int] = {}
    for seed in range(start_seed, start_seed + _MAX_SEEDS):
        row = pick_row(seed)
        key = (row["prompt"], row["leader_view"])
        if key not in seen and per_answer.get(row["answer"], 0) < -(-count // 5):
            seen.add(key)
            per_answer[row["answer"]] = per_answer.get(row["answer"], 0) + 1
            rows.append(row)
            if len(rows) == count:
                return rows
    raise ValueError(
        f"seeds {start_seed}..{start_seed + _MAX_SEEDS - 1} hold {len(rows)} of {count} problems"
    )


def allocation_row(seed: int, difficulty: str) -> dict[str, object]:
    """One resource_allocation problem as a row: ``prompt`` (the problem as JSON and a question), ``answer``
    (its optimal total value, exact), ``seed``."""
    problem = ap.generate(random.Random(seed), difficulty)
    best, _ = ap.solve(problem)
    prompt = (
        "Decide how many units each task gets. Each unit earns the task's value and uses the listed resources; "
        "keep every capacity, unit bound and exclusive pair.\nProblem: "
        + json.dumps(problem.to_dict(), sort_keys=True)
        + "\nWhat is the highest total value a valid allocation reaches? End with 'Answer: N'."
    )
    return {"prompt": prompt, "answer": str(best), "seed": seed}


def main(argv: list[str] | None = None) -> int:
    """Write the rows; print the path and the row count."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kind", choices=("pick", "resource_allocation"), required=True)
    p.add_argument("--out", required=True, help="file to write (its folder is created)")
    p.add_argument(
        "--count", type=int,
        help=f"rows (default 240; --kind pick: at most and by default its {PICK_PROBLEMS} distinct problems)",
    )  # fmt: skip
    p.add_argument("--start-seed", type=int, default=0, help="seed of the first row (default 0)")
    p.add_argument(
        "--difficulty", choices=tuple(ap.DIFFICULTIES), help="resource_allocation level (default easy)"
    )
    args = p.parse_args(argv)
    if args.count is None:
        args.count = PICK_PROBLEMS if args.kind == "pick" else 240
    if args.count < 1:
        p.error(f"--count must be >= 1, got {args.count}")
    if args.kind == "pick":
        if args.difficulty is not None:
            p.error(
                "--difficulty is for --kind resource_allocation; pick rows are private_allocation's pick level"
            )
        if args.count > PICK_PROBLEMS:  # said, not silent
            print(
                f"--count {args.count}: there are only {PICK_PROBLEMS} distinct pick problems (the orders of its "
                f"5 tasks); writing all {PICK_PROBLEMS}", file=sys.stderr,
            )  # fmt: skip
        rows = balanced_pick_rows(min(args.count, PICK_PROBLEMS), args.start_seed)
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    else:
        level = args.difficulty or "easy"
        rows = [allocation_row(s, level) for s in range(args.start_seed, args.start_seed + args.count)]
        text = json.dumps(rows, ensure_ascii=False, indent=1) + "\n"
    out = write_out(p, args.out, text)
    print(f"wrote {len(rows)} rows to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
