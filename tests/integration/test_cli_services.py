"""Every service starts from the CLI on port 0, reports SERVING, lists its API through reflection, and stops
cleanly on SIGTERM (health NOT_SERVING, exit 0)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from marti.rpc.channel import make_channel

SERVICES = {
    "broker": "marti.api.broker.v1.BrokerService",
    "env-server": "marti.api.env.v1.EnvService",
    "store": "marti.api.experience.v1.ExperienceService",
    "trainer": "marti.api.trainer.v1.TrainerService",
}


def _marti(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "marti.cli", *args], capture_output=True, text=True, timeout=timeout_s
    )


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_service_lifecycle_through_cli(name, tmp_path):
    extra = ["--data-dir", str(tmp_path / name)] if name in ("broker", "store") else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "marti.cli", name, "--port", "0", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        match = re.search(r"listening on (\S+)", line)
        assert match, (line, proc.stderr.read() if proc.poll() is not None else "")
        address = match.group(1)
        health = _marti("health", address)
        assert health.returncode == 0 and health.stdout.strip() == "SERVING", health
        assert _marti("health", address, SERVICES[name]).returncode == 0

        channel = make_channel(address)
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        req = reflection_pb2.ServerReflectionRequest(list_services="")
        names = [
            s.name for r in stub.ServerReflectionInfo(iter([req])) for s in r.list_services_response.service
        ]
        assert SERVICES[name] in names and "grpc.health.v1.Health" in names
        req = reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICES[name])
        resp = next(iter(stub.ServerReflectionInfo(iter([req]))))
        assert resp.file_descriptor_response.file_descriptor_proto, "reflection must describe the service"
        channel.close()

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        start = time.monotonic()
        down = _marti("health", address, "--timeout-s", "1")
        assert down.returncode == 1 and time.monotonic() - start < 30, down
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_help_and_unknown_command():
    out = _marti("--help")
    assert out.returncode == 0
    for cmd in ("broker", "env-server", "store", "trainer", "up", "train", "health", "bench"):
        assert cmd in out.stdout
    bad = _marti("frobnicate")
    assert bad.returncode == 2 and "unknown command 'frobnicate'" in bad.stderr
    for service in ("broker", "env-server"):  # every flag shows its real default (factories called)
        text = _marti(service, "--help").stdout
        assert "(default:" in text and "PydanticUndefined" not in text, text
    assert "['pettingzoo.', 'gymnasium.']" in " ".join(_marti("env-server", "--help").stdout.split())


def test_train_rejects_missing_model_naming_it(tmp_path):
    """The design document's config parses, then fails at model loading naming the missing 7B model."""
    from pathlib import Path

    design = Path(__file__).resolve().parents[2] / "examples" / "design" / "multi_agent_collaboration.yaml"
    out = _marti("train", str(design), "--set", f"output.dir={tmp_path}")
    assert out.returncode == 2
    assert "meta-llama/Llama-2-7b-chat-hf" in out.stderr


def test_train_rejects_unknown_key_naming_it(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(
        "training_name: x\nagents:\n  - {name: a, pretrain_model: tiny-llama, role: r}\nlearnin_rate: 1\n"
    )
    out = _marti("train", str(cfg))
    assert out.returncode == 2 and "learnin_rate" in out.stderr
