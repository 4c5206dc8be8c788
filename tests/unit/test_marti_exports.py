"""What ``marti/__init__.py`` exports resolves: every lazy name, the module attributes and the console script."""

import importlib
import tomllib
from pathlib import Path

import pytest

import marti

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", marti.__all__)
def test_every_exported_name_resolves(name: str) -> None:
    assert getattr(marti, name) is not None


@pytest.mark.parametrize(
    ("name", "module", "member"),
    [
        ("aio", "marti.aio", "EnvPool"),
        ("workflow", "marti.team.workflow", "Role"),
        ("gym_view", "marti.env.gym_view", "SingleAgentView"),
    ],
)
def test_module_attributes_are_the_modules_in_their_rooms(name: str, module: str, member: str) -> None:
    value = getattr(marti, name)
    assert value is importlib.import_module(module)
    assert hasattr(value, member)


def test_an_unknown_attribute_is_an_attribute_error_naming_it() -> None:
    with pytest.raises(AttributeError, match="'no_such_name'"):
        _ = marti.no_such_name


def test_the_console_script_names_a_function_that_exists() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, attr = scripts["marti"].partition(":")
    assert callable(getattr(importlib.import_module(module), attr))
