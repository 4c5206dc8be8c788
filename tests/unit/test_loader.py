"""marti.plumbing.loader.load_attr, the one loader of ``module:attr`` import paths (env providers, workflows, the env
server's ``entry_point``): the allow-list is an argument, and every bad path is a typed error naming it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from marti.errors import InvalidArgumentError, NotFoundError
from marti.plumbing.loader import load_attr

ROOT = Path(__file__).resolve().parents[2]


def test_loads_dotted_attributes_of_a_module():
    assert load_attr("math:sqrt") is math.sqrt
    assert load_attr("pathlib:Path.cwd") == Path.cwd


def test_the_allow_list_is_an_argument():
    assert load_attr("math:pi", allowed=["math"]) == math.pi
    with pytest.raises(
        InvalidArgumentError, match=r"entry_point module 'os' is not allowed.*'math', 'json'$"
    ):
        load_attr("os:system", allowed=["math", "json"], what="entry_point")
    with pytest.raises(InvalidArgumentError, match="not allowed"):  # no file may slip past a list
        load_attr("math.py:sqrt", allowed=["math"], files=True)


@pytest.mark.parametrize("bad", ["math.sqrt", ":sqrt", "math:", 3, None])
def test_malformed_paths_name_the_form(bad):
    with pytest.raises(InvalidArgumentError, match=r"env provider must look like 'module:function', got"):
        load_attr(bad, what="env provider", form="'module:function'")


def test_missing_modules_files_and_attributes_are_not_found(tmp_path):
    with pytest.raises(NotFoundError, match="cannot import module 'no_such_mod_xyz'"):
        load_attr("no_such_mod_xyz:f")
    with pytest.raises(NotFoundError, match="has no attribute 'nope'"):
        load_attr("math:nope")
    with pytest.raises(NotFoundError, match="does not exist"):
        load_attr(f"{tmp_path}/absent.py:f", files=True)
    f = tmp_path / "mine.py"
    f.write_text("VALUE = 7\n")
    assert load_attr(f"{f}:VALUE", files=True) == 7
    with pytest.raises(NotFoundError):  # without files=, a .py path is a module name that does not import
        load_attr(f"{f}:VALUE")


def test_no_other_loader_of_import_paths_in_the_sdk_or_services():
    """importlib.import_module on a caller's string lives only in marti/plumbing/loader.py (the CLI's command table, the
    SDK's lazy names and the proto registry import fixed module names of their own)."""
    own = {
        "marti/plumbing/loader.py",
        "marti/command/main.py",
        "marti/__init__.py",
        "marti/rpc/serving/server.py",
    }
    users = [
        str(p.relative_to(ROOT))
        for top in ("marti", "services")
        for p in (ROOT / top).rglob("*.py")
        if "import_module(" in p.read_text() and str(p.relative_to(ROOT)) not in own
    ]
    assert not users, users


@pytest.mark.parametrize(
    ("source", "line", "error"),
    [
        ("def reward(:\n    pass\n", 1, "SyntaxError"),
        ("X = 1\nimport no_such_dependency_xyz\n", 2, "ModuleNotFoundError"),
        ("X = 1\n\nY = undefined_name\n", 3, "NameError"),
    ],
)
def test_a_file_that_fails_to_run_is_a_typed_error_naming_file_and_line(tmp_path, source, line, error):
    """A user's reward or workflow file with a bug is an InvalidArgumentError naming the path, the file, the line
    and the exception, never a raw traceback; once fixed, the same path loads (no broken module is kept)."""
    f = tmp_path / "my_rewards.py"
    f.write_text(source)
    with pytest.raises(
        InvalidArgumentError, match=rf"exists but failed to load at {f}:{line}: {error}"
    ) as info:
        load_attr(f"{f}:reward", files=True)
    assert info.value.__cause__ is not None
    f.write_text("def reward():\n    return 1\n")
    assert load_attr(f"{f}:reward", files=True)() == 1


def test_a_module_that_fails_to_run_is_not_reported_as_missing(tmp_path, monkeypatch):
    """A module that exists but imports a missing package is an InvalidArgumentError naming that package, not a
    NotFoundError saying the user's own module is absent; a missing submodule of a real package is NotFound."""
    (tmp_path / "team_rewards_xyz.py").write_text("import no_such_dependency_xyz\n")
    (tmp_path / "broken_syntax_xyz.py").write_text("def f(:\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        InvalidArgumentError, match="'team_rewards_xyz' exists but failed.*no_such_dependency_xyz"
    ):
        load_attr("team_rewards_xyz:f")
    with pytest.raises(InvalidArgumentError, match=r"broken_syntax_xyz\.py:1: SyntaxError"):
        load_attr("broken_syntax_xyz:f")
    with pytest.raises(NotFoundError, match="cannot import module 'json.no_such_sub'"):
        load_attr("json.no_such_sub:f")
