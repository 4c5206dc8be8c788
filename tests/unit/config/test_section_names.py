"""A config section's class name names one class: no class under services/ or marti/ shares it.

Two ``PolicyConfig`` classes (the YAML ``policy`` section and the trainer's policy layout) were one name for two
things; the trainer's is :class:`services.trainer.models.policy.PolicyLayout` now.
"""

from __future__ import annotations

import ast
from pathlib import Path

from pydantic import BaseModel

import marti.config.schema as schema

ROOT = Path(__file__).resolve().parents[3]


def _section_names() -> set[str]:
    """The class names of the config's sections (every pydantic model defined in marti/config/schema.py)."""
    return {
        name
        for name, obj in vars(schema).items()
        if isinstance(obj, type) and issubclass(obj, BaseModel) and obj.__module__ == schema.__name__
    }


def test_no_other_class_takes_a_config_sections_name():
    sections = _section_names()
    assert {"AlgorithmConfig", "PolicyConfig", "TrainConfig"} <= sections
    clashes = []
    for path in sorted([*ROOT.glob("services/**/*.py"), *ROOT.glob("marti/**/*.py")]):
        if path.resolve() == Path(schema.__file__).resolve():
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.name in sections:
                clashes.append(f"{path.relative_to(ROOT)}: class {node.name}")
    assert not clashes, f"a class shares a config section's name: {clashes}"
