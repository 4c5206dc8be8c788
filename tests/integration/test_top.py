"""``marti top`` against real servers: discovery by reflection, broker/store/env/trainer figures, rates, errors."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from marti.api.trainer.v1 import trainer_pb2, trainer_service_pb2, trainer_service_pb2_grpc
from marti.clients.broker import MartiCommClient
from marti.clients.experience import ExperienceSharingClient
from marti.command import top
from marti.rpc.client.channel import make_channel
from marti.rpc.settings import ServerSettings
from marti.rpc.testing import serve_in_thread
from marti.types.trajectory import Trajectory, Turn
from services.comm_broker.servicer import broker_service
from services.comm_broker.settings import BrokerSettings
from services.env_server.servicer import env_service
from services.env_server.settings import EnvServerSettings
from services.experience_store.__main__ import make_spec
from services.experience_store.settings import StoreSettings
from services.trainer.__main__ import build_specs
from services.trainer.job.service.settings import TrainerSettings
from services.trainer.observe.monitor import ResourceMonitor, driver_pids

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "top-token"


def _specs(trainer: TrainerSettings | None = None):
    def build():
        specs = [
            broker_service(BrokerSettings(port=0)),
            env_service(EnvServerSettings(port=0)),
            make_spec(StoreSettings(port=0))[0],
        ]
        return specs + (build_specs(trainer) if trainer is not None else [])

    return build


@pytest.fixture(scope="module")
def address():
    """One server with broker, env server, store and an idle trainer, token required."""
    with serve_in_thread(_specs(TrainerSettings(port=0)), ServerSettings(port=0, token=TOKEN)) as server:
        yield server.address


def _traj(episode: str) -> Trajectory:
    turn = Turn(
        step=0, prompt_token_ids=[1, 2], response_token_ids=[3, 4], response_logprobs=[-0.1, -0.2], reward=1.0
    )
    return Trajectory(episode_id=episode, agent_id="a1", turns=[turn])


def _cells(line: str) -> list[str]:
    """The non-empty cells of one rendered table row (panel borders included in the split)."""
    return [c.strip() for c in line.split("│") if c.strip()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_once_shows_every_service_kind(address, capsys):
    with ExperienceSharingClient("a1", address, token=TOKEN) as store:
        store.create_table("top_table")
        store.share_experience(_traj("e1"), table="top_table")
        store.share_experience(_traj("e2"), table="top_table")
    code = top.main(["--once", "--rate-window-s", "0", "--width", "200", "--token", TOKEN, address])
    out = capsys.readouterr().out
    assert code == 0, out
    assert address in out and "SERVING" in out and "broker env store trainer" in out
    assert "sessions" in out and "pending" in out and "in flight" in out  # broker queue depths
    assert "collaborative_task_solving" in out and "live sessions: 0 of max 1,024" in out
    row = next(line for line in out.splitlines() if "top_table" in line)
    assert _cells(row)[:2] == ["top_table", "2"], row  # name, size
    assert "trainer: no jobs" in out


def test_rates_come_from_two_polls(address):
    poller = top.ServicePoller(address, token=TOKEN)
    try:
        first = poller.poll()
        with (
            MartiCommClient("x", address, session="top-rates", token=TOKEN) as x,
            MartiCommClient("y", address, session="top-rates", token=TOKEN) as y,
            ExperienceSharingClient("a1", address, token=TOKEN) as store,
        ):
            y.get_messages()
            for i in range(40):
                x.send_message("y", {"i": i})
            x.flush()
            store.create_table("rate_table")
            for i in range(3):
                store.share_experience(_traj(f"r{i}"), table="rate_table")
            time.sleep(0.2)
            second = poller.poll()
    finally:
        poller.close()
    assert second.broker["sent"] - first.broker["sent"] == 40
    assert second.broker["sessions"] >= 1 and second.broker["agents"] >= 2
    assert second.broker["pending"] >= 40 - (second.broker["delivered"] - first.broker["delivered"])
    dt = second.time_s - first.time_s
    assert top._rate(first, second, first.broker["sent"], second.broker["sent"]) == f"{40 / dt:.1f}"
    console = Console(record=True, width=200)
    console.print(top.render({address: first}, {address: second}))
    text = console.export_text()
    assert f"{40 / dt:.1f}" in text, text
    table = next(t for t in second.tables if t["name"] == "rate_table")
    assert (table["size"], table["inserts"]) == (3, 3)


def test_unreachable_and_unauthenticated(address, capsys):
    dead = f"127.0.0.1:{_free_port()}"
    code = top.main(["--once", "--rate-window-s", "0", "--timeout-s", "1", "--width", "200", dead])
    out = capsys.readouterr().out
    assert code == 1 and "UNREACHABLE: UNAVAILABLE" in out, out
    # Health is exempt from auth, the stats rpcs are not: the view says which call was refused.
    snap = top.ServicePoller(address, token=None).poll()
    assert snap.health == "SERVING"
    assert any("UNAUTHENTICATED" in p for p in snap.problems), snap.problems


def test_live_mode_refreshes_and_stops_after_iterations(address, capsys):
    code = top.main(["--iterations", "2", "--interval-s", "0.1", "--width", "200", "--token", TOKEN, address])
    assert code == 0
    assert address in capsys.readouterr().out


def test_live_mode_prints_every_frame_when_the_output_is_not_a_terminal(address, capsys):
    """``marti top ADDR > file`` (or piped to ``tee``, or in a container log) wrote nothing until it ended, then only
    the last frame (rich's live view redraws a terminal; elsewhere it shows the final frame alone), and nothing
    when it was killed. Off a terminal every frame is now printed as it comes."""
    code = top.main(["--iterations", "3", "--interval-s", "0.1", "--width", "200", "--token", TOKEN, address])
    assert code == 0
    assert capsys.readouterr().out.count("marti top ") == 3


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--interval-s", "0.09", "h:1"], "0.09 outside"),
        (["--interval-s", "3601", "h:1"], "3601 outside"),
        (["--timeout-s", "0", "h:1"], "0 outside"),
        (["--max-jobs", "0", "h:1"], "0 outside"),
        (["--max-jobs", "101", "h:1"], "101 outside"),
        (["--rate-window-s", "61", "h:1"], "61 outside"),
        (["--width", "39", "h:1"], "39 outside"),
        (["nohost"], "'nohost' is not host:port"),
        (["h:0"], "'h:0' is not host:port"),
        (["h:65536"], "'h:65536'"),
        ([], "required"),
    ],
)
def test_bad_arguments_are_named(argv, needle, capsys):
    with pytest.raises(SystemExit) as info:
        top.build_parser().parse_args(argv)
    assert info.value.code == 2
    assert needle in capsys.readouterr().err


def test_argument_limits_accept_their_edges():
    args = top.build_parser().parse_args(
        ["--interval-s", "0.1", "--timeout-s", "60", "--max-jobs", "100", "--rate-window-s", "0", "h:65535"]
    )
    assert (args.interval_s, args.timeout_s, args.max_jobs, args.addresses) == (0.1, 60.0, 100, ["h:65535"])
    assert top.build_parser().parse_args(["--max-jobs", "1", "--interval-s", "3600", "h:1"]).max_jobs == 1


@pytest.mark.slow
def test_trainer_job_progress_per_agent(tmp_path, capsys):
    """A real tiny job (Ray, tiny Llama) on a trainer service: top shows its state, steps and agents."""
    with serve_in_thread(_specs(), ServerSettings(port=0)) as services:
        settings = TrainerSettings(
            port=0, broker=services.address, env=services.address, store=services.address
        )
        with serve_in_thread(build_specs(settings), settings) as trainer:
            stub = trainer_service_pb2_grpc.TrainerServiceStub(make_channel(trainer.address))
            cfg = (ROOT / "examples" / "tiny.yaml").read_text().replace("max_steps: 2", "max_steps: 1")
            req = trainer_service_pb2.SubmitJobRequest(
                config_yaml=cfg,
                overrides=[
                    f"output.dir={tmp_path / 'run'}",
                    "environment.max_turns=1",
                    "rollout.eval_every=0",
                ],
            )
            job = stub.SubmitJob(req, timeout=60).job
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                state = stub.GetJob(trainer_service_pb2.GetJobRequest(job_id=job.job_id), timeout=10).job
                if state.state not in (trainer_pb2.JOB_STATE_PENDING, trainer_pb2.JOB_STATE_RUNNING):
                    break
                time.sleep(1.0)
            assert state.state == trainer_pb2.JOB_STATE_SUCCEEDED, state.error
            code = top.main(["--once", "--rate-window-s", "0", "--width", "220", trainer.address])
    out = capsys.readouterr().out
    assert code == 0, out
    job_row = next(line for line in out.splitlines() if job.job_id in line and "SUCCEEDED" in line)
    assert "1/1" in job_row and "100%" in job_row, job_row
    assert "agents (step 1)" in out
    for agent in ("agent_1", "agent_2"):
        row = next(_cells(line) for line in out.splitlines() if _cells(line)[:1] == [agent])
        assert len(row) > 2 and row[1] != "-", row  # its reward, the first column


def test_render_shows_monitor_figures_and_agents():
    """The trainer panel of a job whose records carry the resource monitor's ``system/*`` figures."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    mon = ResourceMonitor(driver_pids({"worker": gone.pid}))
    gone.wait(10)
    metrics = {
        "agent_1/reward": 0.5,
        "agent_1/policy_loss": 0.25,
        "agent_2/reward": -1.0,
        "team/reward": -0.25,
    }
    metrics.update(mon.sample())
    now = time.monotonic()
    prev = top.Snapshot(
        "h:1", now - 2.0, "SERVING", ["trainer"], jobs=[top.JobView("j1", "t", "RUNNING", 3, 10)]
    )
    cur = top.Snapshot(
        "h:1", now, "SERVING", ["trainer"], jobs=[top.JobView("j1", "t", "RUNNING", 5, 10, "", metrics)]
    )
    console = Console(record=True, width=200)
    console.print(top.render({"h:1": prev}, {"h:1": cur}))
    lines = console.export_text().splitlines()
    rows = {c[0]: c for c in (_cells(line) for line in lines) if c}
    assert rows["j1"][3:6] == ["5/10", "50%", "1.0"], rows["j1"]  # 2 steps in 2 s
    assert rows["agent_1"][1:3] == ["0.5", "0.25"] and rows["agent_2"][1:3] == ["-1", "-"]
    assert rows["driver"][2] == f"{metrics['system/driver/rss_mb']:.0f}"
    assert "worker (exited)" in rows
    assert any("host cpu" in line and "available" in line for line in lines)


def test_env_panel_shows_live_sessions_of_both_transports(address):
    """Issue 29 item 16: the env server reports its live sessions (unary and stream) in ListEnvs."""
    import marti

    poller = top.ServicePoller(address, token=TOKEN)
    envs = []
    try:
        before = poller.poll().env_sessions
        envs = [
            marti.make("collaborative_task_solving", address=address, token=TOKEN, transport=t)
            for t in ("unary", "stream", "stream")
        ]
        during = poller.poll()
        for e in envs:
            e.close()
        after = poller.poll().env_sessions
    finally:
        for e in envs:
            e.close()
        poller.close()
    assert during.env_sessions == (before[0] + 3, 1024)
    assert after == before
    console = Console(record=True, width=80)
    console.print(top.render({}, {address: during}))
    assert f"live sessions: {before[0] + 3} of max 1,024" in console.export_text()


def _busy_snapshot() -> top.Snapshot:
    """Every panel of ``marti top`` with long names and numbers in it."""
    broker = {k: 123456.0 for k in top._BROKER_FIELDS}
    table = dict.fromkeys(("size", "num_bytes", "inserts", "samples", "evictions"), 123456)
    table.update(name="resource_allocation/agent_1", waiting_inserts=2, waiting_samples=3)
    metrics = {f"agent_1/{c}": 0.123456 for c in top.AGENT_COLUMNS}
    job = top.JobView("job-0123456789", "resource_allocation", "RUNNING", 5, 10, "", metrics)
    return top.Snapshot(
        "127.0.0.1:50051",
        time.monotonic(),
        "SERVING",
        ["broker", "env", "store", "trainer"],
        broker=broker,
        envs=["collaborative_task_solving-v1"],
        env_sessions=(3, 1024),
        tables=[table],
        jobs=[job],
    )


@pytest.mark.parametrize("width", [80, 60])
def test_headers_stay_whole_at_narrow_widths(width):
    """Issue 29 item 16: at 80 columns rich cut every header to three letters; wide tables now split."""
    console = Console(record=True, width=width)
    console.print(top.render({}, {"a": _busy_snapshot()}))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= width
    headers = [
        *("sessions", "agents", "pending", "in flight", "sent/s", "delivered/s", "acked", "dead letters"),
        *("compression", "send ms", "delivery ms", "table", "size", "MiB", "inserts", "samples"),
        *("inserts/s", "samples/s", "waiting ins/smp", "evicted", "job", "name", "state", "step"),
        *("progress", "steps/s", "agent", *top.AGENT_COLUMNS),
    ]
    cells = {c for line in text.splitlines() for c in _cells(line.replace("┃", "│"))}
    missing = [h for h in headers if h not in cells]
    assert not missing, text
    assert "resource_allocation/agent_1" in text and "live sessions: 3 of max 1,024" in text


def test_top_reads_the_services_through_the_typed_sdk_clients():
    """marti top polls the broker, env server, store and trainer with the SDK's clients (typed answers and
    marti.errors), not raw service stubs: it imports no generated service module of marti.api."""
    import ast

    tree = ast.parse(Path(top.__file__).read_text())
    stubs = [
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("marti.api")
    ]
    assert not stubs, stubs
