"""Text is full Unicode end to end: LaTeX, Chinese and emoji come back exactly from every file format and from
the JSON a remote env server receives; nothing is ASCII-sanitised."""

from __future__ import annotations

import json

import pytest

from marti.data import ProblemSet
from tests.unit.data.files import write

TEXT_ROWS = [
    {"prompt": r"Compute $\frac{1}{2} + \sqrt{x^2}$ when $x = -3$.", "answer": r"\boxed{\frac{7}{2}}"},
    {"prompt": "小明有 3 个苹果，又买了 5 个。他现在有几个苹果？", "answer": "8 个"},
    {"prompt": "Quelle est la capitale de l’Allemagne ? 🇩🇪🎉 — réponds « en un mot »", "answer": "Berlin ✅"},
    {"prompt": "Zero-width\u200bjoiner and tab\tand newline\nkept", "answer": "Ω≈ç√∫"},
]


@pytest.mark.parametrize("kind", ["json", "jsonl", "parquet", "csv"])
def test_unicode_round_trips_through_each_format_and_json(tmp_path, kind):
    problems = ProblemSet.from_source(
        str(write(tmp_path, kind, TEXT_ROWS)), input_key="prompt", label_key="answer"
    )
    rows = [problems.row(i) for i in range(len(problems))]
    assert rows == TEXT_ROWS
    assert [problems.prompt(i) for i in range(4)] == [r["prompt"] for r in TEXT_ROWS]
    # how a row reaches a remote env server: inside the env config, as JSON text
    for text in (json.dumps(rows, ensure_ascii=False), json.dumps(rows)):
        assert json.loads(text) == TEXT_ROWS
