"""The main job on an existing two-node Ray cluster started with `ray start`, with token authentication on.

Both nodes run on this machine, each with its own ports and temp dir, under a HOME of the test's own whose
`~/.ray/auth_token` holds the cluster's token. The head is started as a new user would (`RAY_AUTH_MODE` unset:
Ray turns token authentication on because the token file exists); the second node with `RAY_AUTH_MODE=token`
(Ray never turns it on by itself for a joining node) and a `node2` resource. `marti train` then attaches with
`ray.address` and `RAY_AUTH_MODE` unset, which Ray alone refuses (`InvalidAuthToken`), and runs one actor on
each node. Every process is stopped by its own `ray start --block` process (never `ray stop`, which would stop
every Ray on the machine), then anything left under the temp dir is killed.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from marti.config import load_config
from marti.errors import UnauthenticatedError
from services.trainer.models.resolve import model_cache_root
from services.trainer.ray.auth import find_token, gcs_accepts, prepare_cluster_auth
from services.trainer.ray.runtime import RayRuntime

ROOT = Path(__file__).resolve().parents[3]
RAY = str(Path(sys.executable).parent / "ray")
pytestmark = pytest.mark.slow


#: Ports this module has handed out: a port is free again once its probe socket closes, so a later call could get
#: one an earlier call gave to another Ray component (a head's GCS and a node's agent came out equal once, and
#: `ray start` refused the head).
_HANDED_OUT: set[int] = set()


def _free_ports(n: int) -> list[int]:
    """``n`` free ports, none of them handed out by an earlier call."""
    socks, ports = [], []
    while len(ports) < n:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)  # held until all are chosen: no repeat within the call
        port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            ports.append(port)
            _HANDED_OUT.add(port)
    for s in socks:
        s.close()
    return ports


def _ray_start(name: str, base: Path, env: dict[str, str], *args: str) -> subprocess.Popen:
    """Start `ray start --block` of one node with ports and a temp dir of its own (log: ``base/<name>.log``)."""
    p = _free_ports(8)
    cmd = [
        RAY, "start", "--block", "--node-ip-address=127.0.0.1", f"--temp-dir={base / name}",
        f"--node-manager-port={p[0]}", f"--object-manager-port={p[1]}", f"--dashboard-agent-listen-port={p[2]}",
        f"--dashboard-agent-grpc-port={p[3]}", f"--metrics-export-port={p[4]}", f"--runtime-env-agent-port={p[5]}",
        "--num-cpus=1", "--disable-usage-stats", "--include-log-monitor=false", *args,
    ]  # fmt: skip
    with (base / f"{name}.log").open("w") as out:
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _wait(ready, what: str, procs: list[subprocess.Popen], base: Path, timeout_s: float = 90) -> None:
    """Poll ``ready()`` until true; on a timeout or a dead `ray start`, stop everything and fail with the logs."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            _stop(procs, base)
            logs = "\n".join(f"{f.name}:\n{f.read_text()[-2000:]}" for f in sorted(base.glob("*.log")))
            pytest.fail(f"{what} did not happen:\n{logs}")
        time.sleep(0.2)


def _started(base: Path, name: str) -> bool:
    return "Ray runtime started" in (base / f"{name}.log").read_text()


def _stop(procs: list[subprocess.Popen], base: Path) -> None:
    """SIGTERM each `ray start --block` (it stops its node's processes), then kill whatever still runs under
    ``base`` (a worker the raylet did not reap)."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=45)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    for p in psutil.process_iter(["pid", "cmdline"]):
        if p.info["pid"] != os.getpid() and str(base) in " ".join(p.info["cmdline"] or []):
            try:
                p.kill()
            except psutil.Error:
                pass


@pytest.fixture(scope="module")
def cluster():
    """A head and a second node, token authentication on; yields (GCS address, base env, base dir).

    The nodes' temp dirs sit in a short folder directly under /tmp: Ray puts unix sockets in them, whose paths
    may not exceed 107 bytes (pytest's own temp folders, e.g. under a pytest-xdist worker, came to 108)."""
    base = Path(tempfile.mkdtemp(prefix="mrc-", dir="/tmp"))
    home = base / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text(secrets.token_hex(32))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS"))}
    env.update(HOME=str(home), MARTI_MODEL_CACHE=str(model_cache_root()), RAY_USAGE_STATS_ENABLED="0")
    gcs_port, client_port, dash_port = _free_ports(3)
    address = f"127.0.0.1:{gcs_port}"
    procs: list[subprocess.Popen] = []
    try:
        procs.append(
            _ray_start(
                "head",
                base,
                env,
                "--head",
                f"--port={gcs_port}",
                f"--ray-client-server-port={client_port}",
                f"--dashboard-port={dash_port}",
                "--include-dashboard=false",
            )
        )
        # The second node can join as soon as the head's GCS answers (the head's other processes start meanwhile).
        _wait(
            lambda: gcs_accepts(address, timeout_s=1.0) is not None, "the head's GCS answering", procs, base
        )
        procs.insert(
            0,
            _ray_start(
                "node2",
                base,
                {**env, "RAY_AUTH_MODE": "token"},
                f"--address={address}",
                '--resources={"node2": 1}',
            ),
        )
        _wait(lambda: _started(base, "head") and _started(base, "node2"), "both nodes starting", procs, base)
        # Ray turned token authentication on for the head because ~/.ray/auth_token exists.
        assert "Token authentication is enabled" in (base / "head.log").read_text()
        yield address, env, base
    finally:
        _stop(procs, base)
        shutil.rmtree(base, ignore_errors=True)


def _actor_classes(node_dir: Path) -> list[str]:
    """Classes of the actors that ran on a node: the ``:actor_name:`` line Ray writes in each worker's log."""
    names = []
    for out in (node_dir / "session_latest" / "logs").glob("worker-*.out"):
        names += re.findall(r"^:actor_name:(\w+)", out.read_text(errors="replace"), flags=re.M)
    return names


def _train(address: str, env: dict[str, str], run_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable, "-m", "marti.command.main", "train", "examples/tiny.yaml", "--no-progress",
        "--set", f"ray.address={address}", "--set", f"output.dir={run_dir}", "--set", "max_steps=1", *extra,
    ]  # fmt: skip
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_main_job_attaches_to_a_token_cluster_and_uses_both_nodes(cluster, tmp_path):
    address, env, base = cluster
    # per_agent: two policy actors of 1 CPU each (ray.num_cpus_per_worker), on nodes of 1 CPU each, so the
    # job's placement group (PACK) has to span both nodes.
    done = _train(
        address, env, tmp_path / "run", "--set", "policy.mode=per_agent", "--set", "rollout.eval_every=0",
        "--unset", "policy.lora_r", "--unset", "policy.lora_alpha",  # tiny.yaml's: no adapters in per_agent mode
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert "done: 1 steps" in done.stdout
    record = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert (
        record["step"] == 1
        and "agent_1/reward" in record["metrics"]
        and "agent_2/reward" in record["metrics"]
    )
    assert _actor_classes(base / "head").count("PolicyWorker") == 1
    assert _actor_classes(base / "node2").count("PolicyWorker") == 1


def test_a_missing_token_fails_before_ray_init_naming_the_fix(cluster, monkeypatch, tmp_path):
    address, _, _ = cluster
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ray/auth_token
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    runtime = RayRuntime(load_config(ROOT / "examples" / "tiny.yaml", [f"ray.address={address}"]))
    t0 = time.monotonic()
    with pytest.raises(UnauthenticatedError) as err:
        runtime.start()
    assert time.monotonic() - t0 < 10  # Ray alone retries for about 30 s, then reports InvalidAuthToken
    assert str(err.value).startswith(f"the Ray cluster at {address} requires a token")
    for fix in ("~/.ray/auth_token", "RAY_AUTH_TOKEN=", "RAY_AUTH_TOKEN_PATH=", "ray get-auth-token"):
        assert fix in str(err.value)
    assert "RAY_AUTH_MODE" not in os.environ


def test_the_probe_and_a_refused_token_against_the_real_cluster(cluster, monkeypatch, tmp_path):
    address, env, _ = cluster
    monkeypatch.setenv("HOME", env["HOME"])
    token = find_token({})
    assert token is not None and token.source == str(Path(env["HOME"]) / ".ray" / "auth_token")
    assert gcs_accepts(address) is False
    assert gcs_accepts(address, token.value) is True
    assert gcs_accepts(address, "not-the-token") is False
    assert gcs_accepts(f"127.0.0.1:{_free_ports(1)[0]}") is None  # nothing listens: left to ray.init
    with pytest.raises(
        UnauthenticatedError, match=r"refused the token from RAY_AUTH_TOKEN: .*RAY_AUTH_TOKEN_PATH="
    ):
        prepare_cluster_auth(address, environ={"RAY_AUTH_TOKEN": "not-the-token"})
    with pytest.raises(
        UnauthenticatedError, match=r"requires a token and RAY_AUTH_MODE=disabled is set: unset"
    ):
        prepare_cluster_auth(address, environ={"RAY_AUTH_MODE": "disabled"})
    environ: dict[str, str] = {}
    auth = prepare_cluster_auth(address, environ=environ)
    assert (auth.mode, auth.token_source, environ) == ("token", token.source, {"RAY_AUTH_MODE": "token"})
    auth.restore(environ)
    assert environ == {}
