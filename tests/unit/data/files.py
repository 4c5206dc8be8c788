"""Data files the data tests write under ``tmp_path``: the same rows as JSON, JSONL, Parquet or CSV."""

from __future__ import annotations

import csv
import json

import datasets

ROWS = [
    {"prompt": "What is 2 + 3?", "answer": "5", "level": 1},
    {"prompt": "What is 7 * 6?", "answer": "42", "level": 2},
    {"prompt": "What is 10 - 4?", "answer": "6", "level": 1},
]


def write(tmp_path, kind: str, rows=ROWS, name: str = "p"):
    """Write ``rows`` as a file of ``kind`` under ``tmp_path``; returns the path."""
    path = tmp_path / f"{name}.{kind}"
    if kind == "jsonl":
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    elif kind == "json":
        path.write_text(json.dumps(rows, ensure_ascii=False), encoding="utf-8")
    elif kind == "csv":
        with path.open("w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    elif kind == "parquet":
        datasets.Dataset.from_list(rows).to_parquet(str(path))
    return path


def jsonl(tmp_path, rows, name="p.jsonl"):
    """Write ``rows`` as a JSON lines file ``name`` under ``tmp_path``; returns the path."""
    path = tmp_path / name
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path
