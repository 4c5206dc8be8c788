"""A config section's class name names one class: no class under services/ or marti/ shares it.

Two ``PolicyConfig`` classes (the YAML ``policy`` section and the trainer's policy layout) were one name for two
things; the trainer's is :class:`services.trainer.models.policy.PolicyLayout` now.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import marti.config  # noqa: F401 - imports every section module
from marti.config.section import Section

ROOT = Path(__file__).resolve().parents[3]


def _sections() -> dict[str, Path]:
    """Each config section's class name (every :class:`Section` subclass) -> the file that defines it."""
    out: dict[str, Path] = {}
    todo = list(Section.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        out[cls.__name__] = Path(sys.modules[cls.__module__].__file__).resolve()
    return out


def test_no_other_class_takes_a_config_sections_name():
    sections = _sections()
    assert {"AlgorithmConfig", "PolicyConfig", "TrainConfig", "GatewayConfig"} <= set(sections)
    clashes = []
    for path in sorted([*ROOT.glob("services/**/*.py"), *ROOT.glob("marti/**/*.py")]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.ClassDef)
                and node.name in sections
                and path.resolve() != sections[node.name]
            ):
                clashes.append(f"{path.relative_to(ROOT)}: class {node.name}")
    assert not clashes, f"a class shares a config section's name: {clashes}"
