"""What every ``marti bench`` command shares: the checks of its command-line values, and what it prints after its
header (the load average, the ratio table, the load average again) and writes with ``--json PATH`` (every number
as strict JSON)."""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any


def bench_parser(name: str, doc: str | None) -> argparse.ArgumentParser:
    """The parser of ``marti bench NAME``, described by the first paragraph of the bench's docstring ``doc`` as
    plain text (reST double backticks dropped: ``--help`` is read in a terminal)."""
    first = (doc or "").strip().split("\n\n", 1)[0]
    description = " ".join(first.replace("``", "").split())
    return argparse.ArgumentParser(prog=f"marti bench {name}", description=description)


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An ``argparse`` type: an integer >= ``minimum``.

    The returned function raises ``argparse.ArgumentTypeError`` naming the value, which argparse reports with
    the option's name (exit 2).
    """

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {value}")
        return value

    return parse


#: ``argparse`` type: an integer >= 1 (counts).
positive_int = int_at_least(1)
#: ``argparse`` type: an integer >= 0 (0 skips what the option counts).
non_negative_int = int_at_least(0)


def positive_int_list(text: str) -> list[int]:
    """``argparse`` type: comma-separated integers >= 1, each at most once (batch sizes, client counts: one row
    each), in the order given.

    Raises:
        argparse.ArgumentTypeError: naming the text when it names no number, the value that is not an integer
            >= 1, or the values named more than once.
    """
    values = [positive_int(x.strip()) for x in text.split(",") if x.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"must name at least one integer >= 1, got {text!r}")
    repeated = sorted({v for v in values if values.count(v) > 1})
    if repeated:
        raise argparse.ArgumentTypeError(
            f"names {', '.join(map(str, repeated))} more than once, got {text!r}"
        )
    return values


def positive_float(text: str) -> float:
    """``argparse`` type: a finite number > 0 (seconds, rates).

    Raises:
        argparse.ArgumentTypeError: naming the value (NaN and infinity included).
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {value}")
    return value


def check_json_path(parser: argparse.ArgumentParser, path: str | None) -> None:
    """Refuse, before any measurement, a ``--json`` path that is a folder, or whose folder does not exist or cannot
    be written (as the user running it: root can write anywhere).

    Raises:
        SystemExit: through ``parser.error`` (exit 2), naming the path.
    """
    if not path:
        return
    if Path(path).is_dir():
        parser.error(f"--json {path}: is a folder, not a file")
    folder = Path(path).resolve().parent
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        parser.error(f"--json {path}: the folder {folder} does not exist or is not writable")


def strict_json(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, infinity) replaced by None, so it is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value


def write_json(path: str | os.PathLike, out: Any) -> None:
    """Write ``out`` to ``path`` as indented strict JSON (non-finite numbers become null)."""
    Path(path).write_text(json.dumps(strict_json(out), indent=2, allow_nan=False) + "\n")


def print_report(out: dict[str, Any], table_text: str, json_path: str | None) -> None:
    """Print ``table_text`` between the load averages of ``out`` and write ``out`` to ``json_path`` if given.

    Args:
        out: The benchmark's results, with ``loadavg_before`` and ``loadavg_after`` (1, 5, 15-minute averages).
        table_text: The rendered table.
        json_path: Where to write ``out`` as JSON; None or "" writes nothing.
    """
    print("load average before: " + " ".join(f"{x:.2f}" for x in out["loadavg_before"]))
    print()
    print(table_text)
    print()
    print("load average after: " + " ".join(f"{x:.2f}" for x in out["loadavg_after"]))
    if json_path:
        write_json(json_path, out)
        print(f"wrote {json_path}")


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]], align: str) -> str:
    """The one table printer of the benches: a Markdown table, ready to paste into docs/benchmarks.md.

    Args:
        header: The column names.
        rows: One sequence of cells per row, as many as ``header``; each cell is printed with ``str`` (format
            numbers before).
        align: One letter per column: ``l`` (left, text) or ``r`` (right, numbers).

    Raises:
        ValueError: ``align`` or a row does not have one entry per column, or ``align`` holds another letter.
    """
    if len(align) != len(header) or set(align) - {"l", "r"}:
        raise ValueError(f"align must be one 'l' or 'r' per column ({len(header)}), got {align!r}")
    lines = ["| " + " | ".join(header) + " |", "|" + "".join("---|" if a == "l" else "---:|" for a in align)]
    for cells in rows:
        if len(cells) != len(header):
            raise ValueError(f"a row has {len(cells)} cells for {len(header)} columns: {list(cells)!r}")
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)
