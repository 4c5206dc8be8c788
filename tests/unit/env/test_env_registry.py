"""The env registry lives in the SDK (``marti.env.registry``) and finds envs through a lazy provider table: marti
imports nothing of ``services``, the env server's core imports no concrete env, and a provider module is
imported only when one of its env names is used."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from importlib import metadata as importlib_metadata
from pathlib import Path
from types import SimpleNamespace

import pytest

import marti.env.make as me
import marti.env.registry as reg
from marti.env.config import ConfigField, ConfigSchema
from marti.errors import AlreadyExistsError, InvalidArgumentError, NotFoundError, SessionLostError
from services.env_server.core.sessions import SessionManager

ROOT = Path(__file__).resolve().parents[3]


def _imported_modules(path: Path) -> set[str]:
    """Every module named by an ``import`` statement anywhere in ``path`` (top level or inside functions)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


@pytest.mark.parametrize("name", ["make.py", "registry.py", "config.py", "guard.py", "gym_view.py"])
def test_sdk_env_modules_import_nothing_of_services(name):
    assert not {m for m in _imported_modules(ROOT / "marti" / "env" / name) if m.split(".")[0] == "services"}


def test_env_server_core_imports_no_concrete_env():
    for path in (ROOT / "services" / "env_server" / "core").glob("*.py"):
        bad = {m for m in _imported_modules(path) if m.startswith("services.env_server.envs")}
        assert not bad, f"{path.name} imports {bad}"


def test_make_imports_only_the_provider_of_the_env_it_builds():
    code = textwrap.dedent(
        """
        import sys, marti
        assert not [m for m in sys.modules if m.startswith("services")], "importing marti loads no service"
        env = marti.make("collaborative_task_solving", seed=0)
        env.reset(seed=0)
        loaded = {m for m in sys.modules if m.startswith("services")}
        assert "services.env_server.envs.builtin" in loaded, loaded
        assert "services.env_server.envs.adapters" not in loaded, loaded
        assert not [m for m in loaded if m.startswith("services.env_server.core")], loaded
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def _write_provider(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, body: str) -> None:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(name, None)


PROVIDER = """
    from marti.env.config import ConfigField, ConfigSchema
    from marti.env.registry import EnvSpec
    from services.env_server.envs.builtin import make_collaborative, COLLABORATIVE_SCHEMA
    CALLS = []

    def register(registry):
        CALLS.append(1)
        for v in (1, 2):
            registry.register(EnvSpec("toy", v, make_collaborative, COLLABORATIVE_SCHEMA, f"toy v{v}"))
"""


def test_provider_is_imported_on_first_use_once(tmp_path, monkeypatch):
    _write_provider(tmp_path, monkeypatch, "toy_provider_mod", PROVIDER)
    r = reg.Registry({"toy": "toy_provider_mod:register"})
    assert "toy_provider_mod" not in sys.modules, "a provider is not imported before its env is used"
    assert r.resolve("toy").env_id == "toy-v2", "a bare name is the highest version"
    assert r.resolve("toy-v1").version == 1
    r.make("toy-v1", seed=0).reset(seed=0)
    assert [s.env_id for s in r.specs()] == ["toy-v1", "toy-v2"]
    assert sys.modules["toy_provider_mod"].CALLS == [1]


def test_unloadable_provider_is_named_and_listing_skips_it(tmp_path, monkeypatch):
    _write_provider(tmp_path, monkeypatch, "toy_provider_mod2", PROVIDER)
    r = reg.Registry({"toy": "toy_provider_mod2:register", "ghost": "no_such_module_xyz:register"})
    with pytest.raises(NotFoundError, match="no_such_module_xyz"):
        r.make("ghost")
    assert [s.env_id for s in r.specs()] == ["toy-v1", "toy-v2"]
    with pytest.raises(NotFoundError, match=r"unknown env id 'nope'.*toy-v1"):
        r.resolve("nope")


BROKEN_PROVIDERS = """
    from marti.env.registry import EnvSpec
    from services.env_server.envs.builtin import make_collaborative, COLLABORATIVE_SCHEMA

    def raises(registry):
        raise ValueError("provider is broken")

    def misnamed(registry):
        registry.register(EnvSpec("other_name", 1, make_collaborative, COLLABORATIVE_SCHEMA, "x"))
"""


def test_a_broken_provider_is_named_on_every_use_and_listing_skips_it(tmp_path, monkeypatch):
    """A provider that raises (any error: it is another package's code) or cannot be imported is named with its
    error by every later ``make``, whether a listing or a make ran it first; the listing shows the other envs."""
    _write_provider(tmp_path, monkeypatch, "toy_broken_mod", BROKEN_PROVIDERS)
    _write_provider(tmp_path, monkeypatch, "toy_provider_mod3", PROVIDER)
    providers = {
        "toy": "toy_provider_mod3:register",
        "broken": "toy_broken_mod:raises",
        "ghost": "no_such_module_xyz:register",
    }
    listed_first = reg.Registry(providers)
    assert [s.env_id for s in listed_first.specs()] == ["toy-v1", "toy-v2"]
    made_first = reg.Registry(providers)
    for r in (made_first, listed_first, made_first):
        with pytest.raises(
            NotFoundError, match=r"'broken' is provided by 'toy_broken_mod:raises'.*ValueError"
        ):
            r.make("broken")
        with pytest.raises(NotFoundError, match=r"'ghost' is provided by.*no_such_module_xyz"):
            r.make("ghost")
    assert [s.env_id for s in made_first.specs()] == ["toy-v1", "toy-v2"]


def test_a_provider_that_registers_no_env_of_its_name_is_named(tmp_path, monkeypatch):
    _write_provider(tmp_path, monkeypatch, "toy_broken_mod2", BROKEN_PROVIDERS.replace("toy_broken", "x"))
    r = reg.Registry({"mine": "toy_broken_mod2:misnamed"})
    with pytest.raises(
        NotFoundError, match=r"'mine'; its provider 'toy_broken_mod2:misnamed' registered no such"
    ):
        r.make("mine")


def test_provider_strings_and_names_are_checked():
    with pytest.raises(InvalidArgumentError, match="module:function"):
        reg.load_provider("no_colon")
    r = reg.Registry({"toy": "a:b"})
    r.add_provider("toy", "a:b")
    with pytest.raises(AlreadyExistsError, match="toy"):
        r.add_provider("toy", "c:d")


def _entry_point(name: str, value: str, dist: str) -> importlib_metadata.EntryPoint:
    """A ``marti.envs`` entry point declared by the distribution named ``dist``."""
    ep = importlib_metadata.EntryPoint(name, value, reg.ENTRY_POINT_GROUP)
    return ep._for(SimpleNamespace(name=dist))


def test_builtin_envs_are_the_packages_own_entry_points():
    """The built-in envs come from marti-agent's ``marti.envs`` entry points (pyproject), not from module strings
    in the SDK; the installed metadata names each built-in env."""
    ours = {
        ep.name: ep.value
        for ep in importlib_metadata.entry_points(group=reg.ENTRY_POINT_GROUP)
        if ep.dist is not None and ep.dist.name == reg.BUILTIN_DISTRIBUTION
    }
    assert {"collaborative_task_solving", "pettingzoo", "gymnasium", "textarena"} <= set(ours)
    assert reg.entry_point_providers()["pettingzoo"] == ours["pettingzoo"]


def test_entry_points_add_envs_but_never_replace_builtins(monkeypatch):
    real = list(importlib_metadata.entry_points(group=reg.ENTRY_POINT_GROUP))
    ours = next(ep for ep in real if ep.name == "pettingzoo")
    others = [
        _entry_point("mine", "my_pkg:register", "my-pkg"),
        _entry_point("pettingzoo", "evil:register", "evil"),
    ]
    for order in (others + real, real + others):  # whichever order the metadata lists them in
        monkeypatch.setattr(reg.importlib_metadata, "entry_points", lambda group, order=order: list(order))
        monkeypatch.setattr(reg, "_DEFAULT", None)
        providers = reg.default_registry().providers()
        assert providers["mine"] == "my_pkg:register"
        assert providers["pettingzoo"] == ours.value


def test_sdk_names_no_services_module_outside_the_cli_command_table():
    """No ``"services.…"`` module string in the SDK (the envs are entry points); only ``marti/command/main.py`` names the
    services it starts."""
    found = []
    for path in (ROOT / "marti").rglob("*.py"):
        if (
            path.relative_to(ROOT).as_posix() == "marti/command/main.py"
            or "api" in path.relative_to(ROOT).parts
        ):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if re.match(r"services\.[a-z_]+", node.value):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert not found, found


def test_default_registry_lists_the_builtins():
    ids = [d["env_id"] for d in reg.describe_all()]
    assert {"collaborative_task_solving-v1", "pettingzoo-v1", "gymnasium-v1", "textarena-v1"} <= set(ids)


def test_schema_field_lives_in_the_sdk():
    schema = ConfigSchema([ConfigField("n", "int", 3, "count", minimum=1)])
    assert schema.validate({"n": 4}) == {"n": 4}


def test_a_key_given_as_none_gets_its_default_and_the_env_plays():
    """``max_turns=None`` used to pass validation as None and crash the first step with a TypeError."""
    schema = ConfigSchema([ConfigField("n", "int", 3, "count"), ConfigField("o", "str", None, "optional")])
    assert schema.validate({"n": None, "o": None}) == {"n": 3, "o": None}
    env = me.make("collaborative_task_solving", scenario="private_allocation", num_agents=2, max_turns=None,
               difficulty=None)  # fmt: skip
    obs, _ = env.reset(seed=0)
    assert "Turn 0 of at most 12." in obs["agent_1"] and "capacity" not in obs["agent_1"]
    env.step({a: "" for a in env.agents})


def test_unknown_session_is_session_lost_with_its_id():
    sessions = SessionManager(reg.default_registry())
    with pytest.raises(SessionLostError, match=r"call reset\(\)") as info:
        sessions.step("abc", {})
    assert info.value.session_id == "abc" and isinstance(info.value, NotFoundError)
    sid = sessions.create("collaborative_task_solving").session_id
    sessions.close(sid)
    with pytest.raises(SessionLostError):
        sessions.reset(sid)
