"""What every ``marti bench`` command prints after its header: the load average, the ratio table, the load
average again, and (with ``--json PATH``) every number as JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


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
        Path(json_path).write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {json_path}")
