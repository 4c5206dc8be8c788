"""A config with a YAML syntax error is refused in one line that names the file once, with the line and column
of the problem: ``marti train`` printed PyYAML's own text after the file's name, over six lines, with a
placeholder file name twice (``in "<unicode string>", line 4, column 10``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from marti.config import load_config
from marti.errors import InvalidArgumentError

#: An unclosed flow mapping on line 3, found by the parser at line 4.
BAD = "training_name: t\nagents:\n  - {name: a, pretrain_model: tiny-llama, role: r\nmax_steps: 2\n"
WHY = (
    "expected ',' or '}', but got ':' at line 4, column 10 (while parsing a flow mapping at line 3, column 5)"
)


def test_marti_train_names_the_file_and_line_once_in_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD)
    proc = subprocess.run(
        [sys.executable, "-m", "marti.command.main", "train", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [f"marti train: {bad}: not valid YAML: {WHY}"], proc.stderr


def test_load_config_and_an_override_say_it_the_same_way(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD)
    with pytest.raises(InvalidArgumentError) as refused:
        load_config(bad)
    assert str(refused.value) == f"{bad}: not valid YAML: {WHY}"
    good = tmp_path / "good.yaml"
    good.write_text(BAD.replace("role: r\n", "role: r}\n"))
    with pytest.raises(InvalidArgumentError) as refused:
        load_config(good, ["max_steps=[1"])
    assert str(refused.value) == (
        "override max_steps: value '[1' is not a YAML scalar or list: expected ',' or ']', but got '<stream end>' "
        "at line 1, column 3 (while parsing a flow sequence at line 1, column 1)"
    )
