"""Write small arithmetic word problems as a JSONL dataset, for the workflow examples of docs/datasets.md
("Workflows over your data": ``examples/data/single_solver.yaml``, ``debate.yaml``, ``chain.yaml``, ...).

Each row is ``{"prompt": ..., "answer": ...}``: a one- or two-step word problem over small integers whose exact
answer is an integer (``answer`` its decimal text), for the ``numeric`` verifier. With ``--latex`` every
``--latex``-th row instead asks for a fraction in ``\\boxed{}`` and its ``answer`` is LaTeX (``\\frac{3}{4}``), for
the ``math`` verifier (which also reads the integer rows). The rows depend only on ``--seed`` and ``--count``.

Usage::

    python scripts/data/make_arithmetic_data.py --count 200 --out data/arithmetic.jsonl
    python scripts/data/make_arithmetic_data.py --count 200 --latex 5 --out data/arithmetic_latex.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from fractions import Fraction
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script from a clone
    sys.path.insert(0, str(ROOT))

from scripts.data.output import write_out  # noqa: E402

_NAMES = ("Ana", "Bo", "Chen", "Dara", "Eli", "Femi", "Gus", "Hana")
_THINGS = ("apples", "books", "coins", "pencils", "stamps", "marbles")


def integer_row(rng: random.Random) -> dict[str, str]:
    """One word problem with an integer answer: ``{"prompt", "answer"}``."""
    who, thing = rng.choice(_NAMES), rng.choice(_THINGS)
    a, b, c = rng.randint(2, 20), rng.randint(2, 9), rng.randint(1, 9)
    kind = rng.randrange(3)
    if kind == 0:
        text, value = f"{who} has {a} {thing} and buys {b} more. How many {thing} does {who} have now?", a + b
    elif kind == 1:
        text, value = f"{who} has {a + b} {thing} and gives away {b}. How many {thing} are left?", a
    else:
        text = f"{who} buys {b} bags of {a} {thing} each, then loses {c}. How many {thing} does {who} have?"
        value = a * b - c
    return {"prompt": f"{text} Give the answer as 'Answer: <number>'.", "answer": str(value)}


def latex_row(rng: random.Random) -> dict[str, str]:
    """One problem whose answer is a fraction written in LaTeX (``\\frac{p}{q}``, or an integer when whole)."""
    who, thing = rng.choice(_NAMES), rng.choice(_THINGS)
    total, part = rng.randint(4, 12), 0
    while part == 0:
        part = rng.randint(1, total - 1)
    share = Fraction(part, total)
    answer = (
        str(share.numerator)
        if share.denominator == 1
        else f"\\frac{{{share.numerator}}}{{{share.denominator}}}"
    )
    text = (
        f"{who} has {total} {thing} and gives {part} of them away. What fraction of the {thing} did {who} give "
        "away? Write it in lowest terms as $\\boxed{\\frac{p}{q}}$."
    )
    return {"prompt": text, "answer": answer}


def make_rows(count: int, seed: int, latex_every: int = 0) -> list[dict[str, str]]:
    """``count`` rows drawn with ``random.Random(seed)``; every ``latex_every``-th row (1-based; 0: none) is a
    LaTeX-answer row.

    Raises:
        ValueError: ``count`` < 1 or ``latex_every`` < 0.
    """
    if count < 1 or latex_every < 0:
        raise ValueError(f"need count >= 1 and latex >= 0, got count={count}, latex={latex_every}")
    rng = random.Random(seed)
    return [
        latex_row(rng) if latex_every and (i + 1) % latex_every == 0 else integer_row(rng)
        for i in range(count)
    ]


def main(argv: list[str] | None = None) -> int:
    """Write the rows (see the module docstring); returns the exit status."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="JSONL file to write (its folder is created)")
    p.add_argument("--count", type=int, default=200, help="rows (default 200)")
    p.add_argument("--seed", type=int, default=0, help="seed of the draws (default 0)")
    p.add_argument("--latex", type=int, default=0, help="every N-th row has a LaTeX answer (default 0: none)")
    args = p.parse_args(argv)
    try:
        rows = make_rows(args.count, args.seed, args.latex)
    except ValueError as e:
        p.error(str(e))
    out = write_out(p, args.out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(f"wrote {len(rows)} rows to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
