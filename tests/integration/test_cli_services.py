"""Every service starts from the CLI on port 0, reports SERVING, lists its API through reflection, and stops
cleanly on SIGTERM (health NOT_SERVING, exit 0); ``marti up`` restarts a service killed under it, with its data,
until its restart limit."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from log_wait import wait_for

from marti.clients.broker import MartiCommClient
from marti.clients.experience import ExperienceSharingClient
from marti.command.stack import SERVICE_KEYS
from marti.rpc.client.channel import make_channel
from marti.types.trajectory import Trajectory, Turn

SERVICES = {
    "broker": "marti.api.broker.v1.BrokerService",
    "env-server": "marti.api.env.v1.EnvService",
    "store": "marti.api.experience.v1.ExperienceService",
    "trainer": "marti.api.trainer.v1.TrainerService",
}


def _marti(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "marti.command.main", *args], capture_output=True, text=True, timeout=timeout_s
    )


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_service_lifecycle_through_cli(name, tmp_path):
    extra = ["--data-dir", str(tmp_path / name)] if name in ("broker", "store") else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "marti.command.main", name, "--port", "0", *extra],
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


def _free_port() -> int:
    """A port no one listens on now (bound on port 0, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _kill9(data_dir: Path) -> int:
    """SIGKILL the service holding ``data_dir`` (its lock file holds the pid); returns the pid."""
    pid = int((data_dir / ".lock").read_text())
    os.kill(pid, signal.SIGKILL)
    return pid


def test_marti_up_restarts_a_killed_service_with_its_data_until_its_limit(tmp_path):
    """``marti up`` stopped the whole stack when one service died. Now a store and a broker killed with
    SIGKILL come back on their ports with their data dirs (the items inserted and the messages sent before are
    read back through the SDK clients), each restart is one log line, and one failure more than
    ``--max-restarts`` stops the stack with a line naming the service and its exit code, exit 1.

    The ports come from ``MARTI_<SERVICE>_PORT`` (``marti up`` passed ``--port 50051``-``50053`` over them: the
    variables were accepted and did nothing)."""
    data, out, err = tmp_path / "data", tmp_path / "out", tmp_path / "err"
    ports = {"broker": _free_port(), "env-server": _free_port(), "store": _free_port()}
    env = dict(os.environ, **{f"MARTI_{SERVICE_KEYS[name]}_PORT": str(port) for name, port in ports.items()})
    cmd = [sys.executable, "-m", "marti.command.main", "up", "--no-trainer", "--data-dir", str(data)]
    cmd += ["--max-restarts", "1", "--restart-backoff-s", "0.1"]
    with out.open("w") as stdout, err.open("w") as stderr:
        up = subprocess.Popen(cmd, stdout=stdout, stderr=stderr, text=True, env=env)
    try:
        lines = wait_for(out, "all services SERVING", up)
        address = dict(re.findall(r"^(\S+)\s+SERVING at (\S+)$", lines, re.M))
        assert address == {name: f"127.0.0.1:{port}" for name, port in ports.items()}, lines
        store = ExperienceSharingClient("a1", address["store"], timeout_s=10)
        turn = Turn(
            step=0, prompt_token_ids=[1], response_token_ids=[2], response_logprobs=[-0.5], reward=1.0
        )
        store.share_experiences([Trajectory(f"ep{i}", "a1", turns=[turn]) for i in range(5)])
        sender = MartiCommClient("a", address["broker"], session="s", timeout_s=10)
        for i in range(5):
            sender.send_message("b", {"i": i})
        sender.flush()

        store_pid, broker_pid = _kill9(data / "store"), _kill9(data / "broker")
        log = wait_for(err, "broker SERVING again", up)
        wait_for(err, "store SERVING again", up)
        for name in ("store", "broker"):
            assert (
                f"marti up: {name} exited with code -9 (SIGKILL); restarting it in 0.1 s (restart 1 of at most 1"
                in log
            )
        assert int((data / "store" / ".lock").read_text()) != store_pid
        assert int((data / "broker" / ".lock").read_text()) != broker_pid
        episodes = {t.episode_id for t in store.get_trajectories(agent_id="a1")}  # same client, same address
        assert episodes == {f"ep{i}" for i in range(5)}
        receiver = MartiCommClient("b", address["broker"], session="s", timeout_s=10)
        got: list[int] = []
        deadline = time.monotonic() + 10
        while len(got) < 5 and time.monotonic() < deadline:
            got += [m.content["i"] for m in receiver.get_messages(timeout_s=1)]
        assert sorted(got) == list(range(5))
        for client in (store, sender, receiver):
            client.close()

        _kill9(data / "store")  # a second failure within the window: over --max-restarts 1
        assert up.wait(timeout=60) == 1
        log = err.read_text()
        assert (
            "marti up: error: store exited with code -9 (SIGKILL); restarted 1 times within 60 s already "
            "(--max-restarts 1, --restart-window-s 60); stopping the stack"
        ) in log, log
        assert "Traceback" not in log, log
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()


def test_marti_up_stop_grace_s_0_kills_the_services_at_shutdown(tmp_path):
    """``--stop-grace-s`` is the time the services get, all together, to exit after SIGTERM when ``marti up``
    stops (it was a fixed 15 s each): with 0 the first one waited for is SIGKILLed at once (code -9); with the
    default they exit cleanly (0; tests/integration/test_doc_snippets.py)."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "marti.command.main", "up", "--no-trainer", "--ephemeral-ports"]
    with out.open("w") as stdout:
        up = subprocess.Popen([*cmd, "--stop-grace-s", "0"], stdout=stdout, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(out, "all services SERVING", up)
        up.send_signal(signal.SIGINT)
        _, err = up.communicate(timeout=60)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    assert up.returncode == 0, err
    # the store is waited first, at once; the others may have finished their clean exit meanwhile
    assert re.search(r"^stopped: store=-9, env-server=(-9|0), broker=(-9|0)$", out.read_text(), re.M), (
        out.read_text(),
        err,
    )


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_marti_up_refuses_a_bad_stop_grace_before_starting_anything(value):
    done = _marti("up", "--stop-grace-s", value)
    assert done.returncode == 2
    assert f"marti up: error: --stop-grace-s {float(value)!r} is out of range (>= 0 seconds" in done.stderr


def test_marti_up_interrupted_while_starting_stops_at_once(tmp_path):
    """Ctrl-C while ``marti up`` started its services: it went on starting every one (up to a minute each when
    busy), printed "all services SERVING", then stopped them. Now it stops what it started at once, exit 0."""
    data = tmp_path / "data"
    up = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "marti.command.main",
            "up",
            "--no-trainer",
            "--ephemeral-ports",
            "--data-dir",
            str(data),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not (
            data / "broker" / ".lock"
        ).exists():  # the broker started; the env server and store not yet
            assert up.poll() is None and time.monotonic() < deadline, up.communicate()
            time.sleep(0.02)
        up.send_signal(signal.SIGINT)
        out, err = up.communicate(timeout=30)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    assert up.returncode == 0, (out, err)
    assert "marti up: SIGINT while starting; stopped the services started so far" in err, err
    assert "SERVING" not in out and "Traceback" not in err, (out, err)
    broker = int((data / "broker" / ".lock").read_text())
    with pytest.raises(ProcessLookupError):  # stopped, not left behind
        os.kill(broker, 0)
