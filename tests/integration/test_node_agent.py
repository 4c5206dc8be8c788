"""A Node.js agent (examples/node_agent, @grpc/grpc-js + @grpc/proto-loader) plays one resource_allocation
episode with a Python agent against real broker, env server and store processes with a bearer token on:
shared env session, zstd batches both ways (every payload checked by SHA-256 on the other side), trajectories
shared through the store and read back by the other language. With ``--gateway`` the Node agent's actions come
from a real inference gateway (gRPC) and its reward report releases the recorded episode to training."""

from __future__ import annotations

import fcntl
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import google.rpc
import pytest

from marti.clients.broker import MartiCommClient
from marti.clients.experience import ExperienceSharingClient
from marti.clients.inference import InferenceClient

ROOT = Path(__file__).resolve().parents[2]
AGENT_DIR = ROOT / "examples" / "node_agent"
TOKEN = "node-interop-token"

pytestmark = [
    pytest.mark.skipif(
        shutil.which("node") is None, reason="node is not installed (needed for the Node agent)"
    ),
    pytest.mark.skipif(shutil.which("npm") is None, reason="npm is not installed (needed for npm ci)"),
]


@pytest.fixture(scope="module")
def node_modules() -> Path:
    """``npm ci`` from the committed lock file (the npm cache makes reruns offline), once per lock file.

    Test processes running at once (pytest-xdist workers) take a file lock, and a stamp in ``node_modules``
    holding the lock file's sha256 tells a later one that ``npm ci`` already ran: ``npm ci`` deletes
    ``node_modules`` first, which would pull it from under another worker's running Node agent."""
    target = AGENT_DIR / "node_modules"
    stamp = target / ".marti-npm-ci"
    want = hashlib.sha256((AGENT_DIR / "package-lock.json").read_bytes()).hexdigest()
    with open(Path(tempfile.gettempdir()) / "marti-node-agent-npm-ci.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (stamp.is_file() and stamp.read_text() == want):
            out = subprocess.run(
                ["npm", "ci", "--no-audit", "--no-fund", "--prefer-offline"],
                cwd=AGENT_DIR,
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert out.returncode == 0, out.stderr[-3000:]
            stamp.write_text(want)
    return target


def _start(name: str, data_dir: Path | None) -> tuple[subprocess.Popen, str]:
    extra = ["--data-dir", str(data_dir)] if data_dir else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "marti.command.main", name, "--port", "0", "--token", TOKEN, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    line = proc.stdout.readline()
    match = re.search(r"listening on (\S+)", line)
    if not match:
        proc.kill()
        raise AssertionError(f"{name} did not start: {line!r} {proc.stderr.read()[-2000:]}")
    return proc, match.group(1)


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    """Broker, env server and store as real processes (``marti <service> --port 0 --token ...``)."""
    tmp = tmp_path_factory.mktemp("node_services")
    procs, addrs = [], {}
    try:
        for name, data in (("broker", None), ("env-server", None), ("store", tmp / "store")):
            proc, addr = _start(name, data)
            procs.append(proc)
            addrs[name] = addr
        yield addrs
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture(scope="module")
def proto_include(tmp_path_factory) -> Path:
    """A folder holding google/rpc/status.proto, copied from googleapis-common-protos."""
    inc = tmp_path_factory.mktemp("proto_include")
    (inc / "google" / "rpc").mkdir(parents=True)
    shutil.copy(Path(list(google.rpc.__path__)[0]) / "status.proto", inc / "google" / "rpc" / "status.proto")
    return inc


@pytest.fixture(scope="module")
def gateway():
    """A real inference gateway (gRPC, token on) serving tiny random policies for both agents of the team.

    Yields ``(address, sink)``; ``sink`` collects the episodes the gateway releases to training.
    """
    pytest.importorskip("transformers", reason="the gateway's tiny policies need the trainer extra")
    from marti.rpc.settings import ServerSettings
    from marti.rpc.testing import serve_in_thread
    from services.gateway.core.gateway import Gateway
    from services.gateway.core.limits import GatewayLimits
    from services.gateway.servicer import service_spec
    from services.trainer.models.loading import build_tiny_model, load_tokenizer
    from services.trainer.rollout.engines.hf import AgentModel, HFRolloutEngine
    from services.trainer.rollout.serving.gateway_backend import EngineBackend

    tok = load_tokenizer()
    agents = ("agent_1", "agent_2")
    engine = HFRolloutEngine(
        {a: AgentModel(build_tiny_model(tok, seed=i), tok) for i, a in enumerate(agents)}
    )
    sink: list = []
    gw = Gateway(
        EngineBackend(engine, {a: tok for a in agents}), GatewayLimits(max_wait_ms=2), sink=sink.append
    )
    with serve_in_thread(lambda: [service_spec(gw)], ServerSettings(port=0, token=TOKEN)) as server:
        yield server.address, sink


def _node_cmd(services, session: str, inc: Path, token: str) -> list[str]:
    return [
        "node", str(AGENT_DIR / "agent.js"), "--env", services["env-server"], "--broker", services["broker"],
        "--store", services["store"], "--session", session, "--token", token, "--proto-include", str(inc),
        "--timeout-s", "60",
    ]  # fmt: skip


def test_node_agent_plays_with_python_agent(node_modules, services, proto_include):
    session = "node-interop-1"
    partner = subprocess.Popen(
        [sys.executable, str(AGENT_DIR / "partner.py"), "--env", services["env-server"], "--broker",
         services["broker"], "--store", services["store"], "--session", session, "--token", TOKEN,
         "--timeout-s", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    node = subprocess.run(
        _node_cmd(services, session, proto_include, TOKEN), capture_output=True, text=True, timeout=120
    )
    p_out, p_err = partner.communicate(timeout=120)
    assert node.returncode == 0, node.stderr[-3000:]
    assert partner.returncode == 0, p_err[-3000:]
    js = json.loads(node.stdout.strip().splitlines()[-1])
    py = json.loads(p_out.strip().splitlines()[-1])

    # env: listed, one shared session, the team solved the problem (valid allocation -> terminated)
    assert "collaborative_task_solving-v1" in js["env_ids"]
    assert js["env_session_id"] == py["env_session_id"] and js["env_closed"] is True
    assert js["node_turns"] >= 1 and js["followed_plan"] is True
    final = js["final_infos"]["agent_2"]
    assert final["valid_allocation"] is True and final["constraint_violations"] == 0
    assert py["final_infos"]["agent_1"]["allocated_value"] == final["allocated_value"]

    # broker, both directions: every payload arrived byte-identical, in order, as zstd frames
    assert js["sent_sha256"] == py["received_sha256"] and len(js["sent_sha256"]) >= 4
    assert py["sent_sha256"] == js["received_sha256"] and len(py["sent_sha256"]) >= 3
    assert js["verified_by_partner"] >= 2 and py["verified_by_node"] >= 2
    # one frame per send: the join, one result per turn, the closing "shared" note. The large ones are zstd;
    # the short note (two random UUIDs in ~250 bytes) goes uncompressed when zstd would not make it smaller.
    sent = js["frames_sent"]
    assert sent["CODEC_ZSTD"] + sent["CODEC_NONE"] == 2 + js["node_turns"]
    assert sent["CODEC_ZSTD"] >= 1 + js["node_turns"] and js["frames_received"]["CODEC_ZSTD"] >= 1
    assert js["bytes"]["sentWire"] < js["bytes"]["sentRaw"]
    assert py["bytes_received_wire"] < py["bytes_received_raw"] and py["compression_ratio"] > 1.2

    # store: Python read the Node trajectory, Node read the Python one; check again from the test
    assert py["node_key"] == js["trajectory_key"] and js["partner_key"] == py["my_key"]
    (node_traj,) = py["node_trajectories"]
    assert node_traj["agent_id"] == "agent_2" and node_traj["role"] == "executor"
    assert node_traj["metadata"]["language"] == "javascript" and node_traj["actions"] == js["actions"]
    with ExperienceSharingClient("checker", services["store"], token=TOKEN) as store:
        trajs = {t.agent_id: t for t in store.get_trajectories(episode_id=js["episode_id"])}
    assert set(trajs) == {"agent_1", "agent_2"}
    assert [t.response_text for t in trajs["agent_2"].turns] == js["actions"]
    assert [t.reward for t in trajs["agent_2"].turns] == pytest.approx(js["rewards"])
    assert trajs["agent_2"].turns[-1].terminated is True

    # state board: the Node agent's PutState is visible to a Python client
    with MartiCommClient("observer", services["broker"], session=session, token=TOKEN) as comm:
        states = comm.get_agent_states(exclude_self=True)
    assert states["agent_2"] == {"role": "executor", "episode_id": js["episode_id"], "done": True}


def test_node_agent_with_wrong_token_is_unauthenticated(node_modules, services, proto_include):
    node = subprocess.run(
        _node_cmd(services, "node-interop-bad", proto_include, "not-the-token"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert node.returncode == 1
    assert "grpc code 16" in node.stderr and "invalid bearer token" in node.stderr, node.stderr[-2000:]


def test_node_agent_acts_through_the_gateway_and_reports_its_reward(
    node_modules, services, proto_include, gateway
):
    address, sink = gateway
    session = "node-gateway-1"
    partner = subprocess.Popen(
        [sys.executable, str(AGENT_DIR / "partner.py"), "--env", services["env-server"], "--broker",
         services["broker"], "--store", services["store"], "--session", session, "--token", TOKEN,
         "--timeout-s", "90"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    cmd = [*_node_cmd(services, session, proto_include, TOKEN), "--gateway", address, "--max-tokens", "16"]
    node = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    p_out, p_err = partner.communicate(timeout=180)
    assert node.returncode == 0, node.stderr[-3000:]
    assert partner.returncode == 0, p_err[-3000:]
    js = json.loads(node.stdout.strip().splitlines()[-1])

    # every action was one recorded Generate call of the gateway's agent_2 policy, its completion sent as it is
    assert js["policy"] == "gateway" and js["node_turns"] >= 1
    gw = js["gateway"]
    assert gw["model"] == "agent_2" and "agent_2" in gw["models"]
    assert [c["text"] for c in gw["calls"]] == js["actions"]
    assert all(c["call_id"].startswith("call-") and 1 <= c["tokens"] <= 16 for c in gw["calls"])
    assert len(gw["calls"]) == js["node_turns"]

    # ReportReward released the episode: the gateway's trace of agent_2 holds exactly those calls and rewards
    assert (gw["released"], gw["dropped"]) == (1, 0)
    (episode,) = [ep for ep in sink if ep["agent_2"].episode_id == js["episode_id"]]
    traj = episode["agent_2"]
    assert [t.response_text for t in traj.turns] == js["actions"]
    assert [len(t.response_token_ids) for t in traj.turns] == [c["tokens"] for c in gw["calls"]]
    assert all(len(t.response_logprobs) == len(t.response_token_ids) for t in traj.turns)
    assert [t.reward for t in traj.turns] == pytest.approx(js["rewards"])
    assert traj.episode_return == pytest.approx(sum(js["rewards"])) and traj.turns[-1].terminated
    assert episode["agent_1"].turns == []  # the Python leader played without the gateway
    with InferenceClient(address, token=TOKEN) as client:
        stats = client.stats()
    assert stats["calls"] >= js["node_turns"] and stats["released"] >= 1

    # the rest of the protocol is unchanged: the store holds the Node agent's actions, tagged with the policy
    with ExperienceSharingClient("checker", services["store"], token=TOKEN) as store:
        trajs = {t.agent_id: t for t in store.get_trajectories(episode_id=js["episode_id"])}
    assert [t.response_text for t in trajs["agent_2"].turns] == js["actions"]
    assert trajs["agent_2"].metadata["policy"] == "gateway:agent_2"


@pytest.mark.slow
def test_node_agent_is_trained_by_a_running_job(node_modules, services, proto_include, tmp_path):
    """A `marti train` job with ``rollout.source: external`` serves agent_2's policy through its gateway; the Node
    agent plays an episode with it (gRPC) and reports its reward, and the job's update trains on that episode."""
    run = tmp_path / "run"
    sets = [
        "rollout.source=external", "external.episodes_per_step=1", "rollout.group_size=1",
        "rollout.episodes_per_step=1", "max_steps=1", "rollout.eval_every=0", f"output.dir={run}",
        "algorithm.advantage_estimator=reinforce++",
    ]  # fmt: skip
    train = subprocess.Popen(
        [sys.executable, "-m", "marti.command.main", "train", "examples/tiny.yaml", "--no-progress",
         "--broker", services["broker"], "--env", services["env-server"], "--store", services["store"],
         "--token", TOKEN, *[x for s in sets for x in ("--set", s)]],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        import time

        deadline = time.monotonic() + 300
        while not (run / "gateway.json").exists():
            assert train.poll() is None, train.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "the job's gateway did not start"
            time.sleep(0.5)
        address = json.loads((run / "gateway.json").read_text())["grpc"]
        session = "node-trained-1"
        partner = subprocess.Popen(
            [sys.executable, str(AGENT_DIR / "partner.py"), "--env", services["env-server"], "--broker",
             services["broker"], "--store", services["store"], "--session", session, "--token", TOKEN,
             "--timeout-s", "90"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        )  # fmt: skip
        cmd = [*_node_cmd(services, session, proto_include, TOKEN), "--gateway", address, "--max-tokens", "8"]
        node = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
        partner.communicate(timeout=180)
        assert node.returncode == 0, node.stderr[-3000:]
        js = json.loads(node.stdout.strip().splitlines()[-1])
        assert js["policy"] == "gateway" and js["gateway"]["released"] == 1
        out, err = train.communicate(timeout=300)
    finally:
        if train.poll() is None:
            train.kill()
    assert train.returncode == 0, err[-3000:]
    assert out.strip().splitlines()[-1] == "trained 1 steps on 1 external episodes", out[-2000:]
    (record,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    m = record["metrics"]
    assert m["agent_2/external_items"] == 1.0 and m["agent_2/num_samples"] == js["node_turns"]
    assert m["agent_2/policy_version"] == 1.0 and m["gateway/released"] == 1.0
