"""Validation of the container deployment in deploy/: the compose files, the Dockerfile and the scripts.

The YAML checks always run (PyYAML). The ``docker-compose config`` checks need Debian's ``docker-compose``
(1.29) on PATH and are skipped with a reason otherwise; they validate offline, no Docker engine needed.
Bringing the stack up for real is ``deploy/bring_up.sh`` (see docs/deploy.md), not part of this suite.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from marti.command.restart_policy import RestartPolicy
from services.comm_broker.settings import BrokerSettings
from services.env_server.settings import EnvServerSettings
from services.experience_store.settings import StoreSettings
from services.trainer.job.service.settings import TrainerSettings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
BASE = DEPLOY / "docker-compose.yml"
PORTS_OVERRIDE = DEPLOY / "docker-compose.override.yml"
HOST_OVERRIDE = DEPLOY / "docker-compose.host.yml"

#: compose service -> (settings class, port variable, default port, data dir or None).
SERVICES = {
    "broker": (BrokerSettings, "MARTI_BROKER_PORT", 50051, "/data/broker"),
    "env-server": (EnvServerSettings, "MARTI_ENV_PORT", 50052, None),
    "store": (StoreSettings, "MARTI_STORE_PORT", 50053, "/data/store"),
    "trainer": (TrainerSettings, "MARTI_TRAINER_PORT", 50054, None),
}
DOCKER_COMPOSE = shutil.which("docker-compose")
needs_compose = pytest.mark.skipif(
    DOCKER_COMPOSE is None,
    reason="docker-compose not on PATH (Debian: apt-get install -y docker-compose); YAML checks still ran",
)


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _env_dict(entries: list[str]) -> dict[str, str | None]:
    """Compose list-form environment -> {name: value or None (passed through from the caller's env)}."""
    out: dict[str, str | None] = {}
    for entry in entries:
        name, sep, value = entry.partition("=")
        out[name] = value if sep else None
    return out


def _default(expr: str) -> str:
    """Resolve compose ``${VAR:-default}`` expressions to their defaults."""
    return re.sub(r"\$\{[A-Z0-9_]+:-([^}]*)\}", r"\1", expr)


def test_four_services_with_their_commands_and_default_ports():
    compose = _load(BASE)
    assert set(compose["services"]) == set(SERVICES)
    for name, (settings_cls, port_var, port, _) in SERVICES.items():
        svc = compose["services"][name]
        env = _env_dict(svc["environment"])
        # The compose default port is the service's own settings default (50051-50054).
        assert settings_cls.model_fields["port"].default == port
        assert _default(env[port_var]) == str(port), name
        assert "MARTI_TOKEN" in env and env["MARTI_TOKEN"] is None, f"{name} must pass MARTI_TOKEN through"
    assert compose["services"]["broker"]["command"][0] == "broker"
    assert compose["services"]["env-server"]["command"] == ["env-server"]
    assert compose["services"]["store"]["command"][0] == "store"
    assert compose["services"]["trainer"]["build"]["target"] == "trainer"
    for name in ("broker", "env-server", "store"):
        assert compose["services"][name]["build"]["target"] == "services"


def test_environment_names_are_real_settings():
    """Every MARTI_<PREFIX>_<FIELD> variable names a field of that service's settings (typos fail here)."""
    compose = _load(BASE)
    for name, (settings_cls, *_rest) in SERVICES.items():
        prefix = settings_cls.model_config["env_prefix"]
        for var in _env_dict(compose["services"][name]["environment"]):
            if var == "MARTI_TOKEN" or var.startswith("MARTI_RAY_"):
                continue
            assert var.startswith(prefix), f"{name}: {var} lacks prefix {prefix}"
            field = var[len(prefix) :].lower()
            assert field in settings_cls.model_fields, f"{name}: {var} is not a {settings_cls.__name__} field"


def test_health_checks_use_marti_health_on_the_service_port():
    compose = _load(BASE)
    for name, (_, port_var, port, _) in SERVICES.items():
        check = compose["services"][name]["healthcheck"]
        assert check["test"][:3] == ["CMD", "marti", "health"], name
        assert check["test"][3] == f"127.0.0.1:${{{port_var}:-{port}}}"
        for key in ("interval", "timeout", "retries", "start_period"):
            assert key in check, f"{name} healthcheck lacks {key}"


def test_restart_policy_matches_marti_up():
    """Every service restarts on failure at most as often as ``marti up`` does by default (it said
    ``unless-stopped``: restarted forever, also after a deliberate clean stop)."""
    default = RestartPolicy()
    assert default.mode == "on-failure"
    compose = _load(BASE)
    for name in SERVICES:
        assert compose["services"][name]["restart"] == f"on-failure:{default.max_restarts}", name


def test_named_volumes_hold_the_broker_and_store_data_dirs():
    compose = _load(BASE)
    assert {"broker-data", "store-data"} <= set(compose["volumes"])
    for name, volume in (("broker", "broker-data"), ("store", "store-data")):
        svc = compose["services"][name]
        data_dir = SERVICES[name][3]
        assert f"{volume}:{data_dir}" in svc["volumes"]
        command = svc["command"]
        assert command[command.index("--data-dir") + 1] == data_dir


def test_trainer_waits_for_healthy_services_and_gets_their_addresses():
    trainer = _load(BASE)["services"]["trainer"]
    assert trainer["depends_on"] == {
        name: {"condition": "service_healthy"} for name in ("broker", "env-server", "store")
    }
    args = [_default(a) for a in trainer["command"]]
    assert args == ["--broker", "broker:50051", "--env", "env-server:50052", "--store", "store:50053"]


def test_port_override_publishes_and_host_override_does_not():
    published = _load(PORTS_OVERRIDE)["services"]
    host = _load(HOST_OVERRIDE)["services"]
    for name, (_, _port_var, port, _) in SERVICES.items():
        assert [_default(p) for p in published[name]["ports"]] == [f"{port}:{port}"]
        assert host[name]["network_mode"] == "host"
        assert "ports" not in host[name]
    assert [_default(a) for a in host["trainer"]["command"]] == [
        "--broker",
        "127.0.0.1:50051",
        "--env",
        "127.0.0.1:50052",
        "--store",
        "127.0.0.1:50053",
    ]
    assert "ports" not in str(_load(BASE)["services"]), (
        "ports belong in the override (host mode refuses them)"
    )


def test_dockerfile_targets_keep_torch_out_of_the_service_image():
    lines = (DEPLOY / "Dockerfile").read_text().splitlines()
    text = "\n".join(line for line in lines if not line.lstrip().startswith("#"))  # instructions only
    stages = re.findall(r"^FROM \S+ AS (\S+)$", text, flags=re.M)
    assert stages == ["build-services", "runtime", "services", "build-trainer", "trainer"]
    services_part = text.split("AS build-trainer")[0]
    assert "[trainer]" not in services_part and "torch" not in services_part.split("AS services")[1]
    assert "--no-index" in text, "images must install from the local wheelhouse only"
    assert "/wheelhouse/" in (DEPLOY / ".gitignore").read_text()


def test_shell_scripts_parse():
    for script in ("bring_up.sh", "make_wheelhouse.sh", "make_base_image.sh", "docker/trainer-entrypoint.sh"):
        path = DEPLOY / script
        assert os.access(path, os.X_OK), f"{script} is not executable"
        subprocess.run(["bash", "-n", str(path)], check=True)


def _bring_up_clean_only(paths: list[Path], *flags: str, **env: str) -> subprocess.CompletedProcess:
    """``bring_up.sh [flags] --clean-only PATH...``: only its exit trap runs, removing what it would have created."""
    clean = {k: v for k, v in os.environ.items() if k != "KEEP_STATE"}
    return subprocess.run(
        ["bash", str(DEPLOY / "bring_up.sh"), *flags, "--clean-only", *map(str, paths)],
        capture_output=True, text=True, timeout=30, env={**clean, **env}, check=True,
    )  # fmt: skip


def _built(tmp_path: Path) -> list[Path]:
    """A stand-in wheelhouse and engine state folder, with files and a nested folder."""
    out = [tmp_path / "wheelhouse", tmp_path / "work dir"]
    for d in out:
        (d / "sub").mkdir(parents=True)
        (d / "sub" / "x.whl").write_bytes(b"w" * 1024)
    return out


def test_bring_up_removes_what_it_created_on_exit(tmp_path):
    built = _built(tmp_path)
    out = _bring_up_clean_only(built)
    assert not any(p.exists() for p in built), out.stdout
    assert "removing" in out.stdout


@pytest.mark.parametrize(
    ("flags", "env"), [(("--keep",), {}), ((), {"KEEP_STATE": "1"})], ids=["flag", "env"]
)
def test_bring_up_keeps_its_state_when_asked(tmp_path, flags, env):
    built = _built(tmp_path)
    out = _bring_up_clean_only(built, *flags, **env)
    assert all((p / "sub" / "x.whl").exists() for p in built), out.stdout
    assert out.stdout.count("kept") == 2


def _compose(*files: Path, args: tuple[str, ...] = ("config", "-q"), env: dict | None = None):
    cmd = [DOCKER_COMPOSE, "--project-directory", str(DEPLOY)]
    for f in files:
        cmd += ["-f", str(f)]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MARTI_")}
    return subprocess.run(
        cmd + list(args), capture_output=True, text=True, timeout=60, env={**clean, **(env or {})}
    )


@needs_compose
@pytest.mark.parametrize("override", [PORTS_OVERRIDE, HOST_OVERRIDE], ids=["published-ports", "host-network"])
def test_docker_compose_config_accepts_the_files(override):
    proc = _compose(BASE, override)
    assert proc.returncode == 0, proc.stderr


@needs_compose
def test_docker_compose_resolves_environment_configuration():
    env = {"MARTI_BROKER_PORT": "6001", "MARTI_TOKEN": "s3cret"}
    proc = _compose(BASE, PORTS_OVERRIDE, args=("config",), env=env)
    assert proc.returncode == 0, proc.stderr
    cfg = yaml.safe_load(proc.stdout)
    broker = cfg["services"]["broker"]
    assert broker["environment"]["MARTI_BROKER_PORT"] == "6001"
    assert broker["environment"]["MARTI_TOKEN"] == "s3cret"
    assert broker["healthcheck"]["test"][-1] == "127.0.0.1:6001"
    assert broker["ports"][0]["published"] == 6001 and broker["ports"][0]["target"] == 6001
    assert "broker:6001" in cfg["services"]["trainer"]["command"]


@needs_compose
def test_docker_compose_config_rejects_a_bad_condition(tmp_path):
    """The validation can fail: an unknown depends_on condition is an error naming it."""
    bad = _load(BASE)
    bad["services"]["trainer"]["depends_on"]["broker"]["condition"] = "service_sleepy"
    path = tmp_path / "docker-compose.yml"
    path.write_text(yaml.safe_dump(bad))
    proc = _compose(path)
    assert proc.returncode != 0
    assert "service_sleepy" in proc.stderr
