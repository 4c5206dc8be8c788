"""docs/config.md documents every config key and launch flag: its generated blocks match the code."""

from __future__ import annotations

import re
from pathlib import Path

from marti.command.launch_flags import FLAG_TABLE, flag_table_markdown
from marti.config import TrainConfig, config_reference_markdown

DOC = Path(__file__).resolve().parents[3] / "docs" / "config.md"


def block(name: str) -> str:
    text = DOC.read_text()
    match = re.search(rf"<!-- BEGIN {name}[^>]*-->\n(.*?)<!-- END {name} -->", text, re.S)
    assert match, f"docs/config.md lacks the {name} block"
    return match.group(1)


def test_key_reference_is_current():
    assert block("KEYS").strip() == config_reference_markdown().strip(), (
        "regenerate the KEYS block of docs/config.md from marti.config.config_reference_markdown()"
    )


def test_flag_table_is_current():
    assert block("FLAGS").strip() == flag_table_markdown().strip()


def test_every_key_has_a_row_with_a_description():
    rows = {
        m.group(1): m.group(2)
        for m in re.finditer(r"^\| `([\w.N]+)` \|.*\| ([^|]*) \|$", block("KEYS"), re.M)
    }
    for name in TrainConfig.model_fields:
        assert rows.get(name, "").strip(), f"{name} is not documented"
    for key in (
        "algorithm.kl_estimator",
        "rollout.group_size",
        "agents.N.is_tuning",
        "budget.max_wall_time_s",
    ):
        assert rows.get(key, "").strip(), f"{key} is not documented"
    assert len([f for f in FLAG_TABLE if f"`--{f}" in block("FLAGS")]) == len(FLAG_TABLE)
