"""TrainerService over real gRPC: submit the tiny job against real services, stream its metrics, stop, errors."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest

from marti.api.trainer.v1 import trainer_pb2, trainer_service_pb2, trainer_service_pb2_grpc
from marti.command.stack import LocalStack
from marti.rpc.client.channel import make_channel
from marti.rpc.testing import serve_in_thread
from services.trainer.__main__ import build_specs
from services.trainer.job.service.settings import TrainerSettings
from tests.local_ray import local_ray

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trainer_stub(tmp_path_factory):
    """The service's stub; its jobs attach to one local Ray (:func:`~tests.local_ray.local_ray`) instead of each
    starting and stopping its own."""
    stack = LocalStack(services=("broker", "env-server", "store"))
    addrs = stack.start()
    settings = TrainerSettings(port=0, broker=addrs["broker"], env=addrs["env-server"], store=addrs["store"])
    try:
        with (
            local_ray(ROOT / "examples" / "tiny.yaml"),
            serve_in_thread(build_specs(settings), settings) as server,
        ):
            channel = make_channel(server.address)
            yield trainer_service_pb2_grpc.TrainerServiceStub(channel)
            channel.close()
    finally:
        stack.stop()


def _config(tmp: Path, max_steps: int) -> str:
    text = (ROOT / "examples" / "tiny.yaml").read_text()
    return text.replace("max_steps: 2", f"max_steps: {max_steps}")


def test_submit_stream_and_finish(trainer_stub, tmp_path):
    req = trainer_service_pb2.SubmitJobRequest(
        config_yaml=_config(tmp_path, 2),
        overrides=[f"output.dir={tmp_path / 'run'}", "environment.max_turns=2"],
    )
    job = trainer_stub.SubmitJob(req, timeout=60).job
    assert job.state in (trainer_pb2.JOB_STATE_PENDING, trainer_pb2.JOB_STATE_RUNNING)
    records = list(
        trainer_stub.StreamMetrics(trainer_service_pb2.StreamMetricsRequest(job_id=job.job_id), timeout=600)
    )
    kinds = [(r.record.kind, r.record.step) for r in records]
    assert ("train", 1) in kinds and ("train", 2) in kinds and ("eval", 0) in kinds, kinds
    train = [r.record for r in records if r.record.kind == "train"]
    assert "agent_1/policy_loss" in train[-1].values
    final = trainer_stub.GetJob(trainer_service_pb2.GetJobRequest(job_id=job.job_id), timeout=10).job
    assert final.state == trainer_pb2.JOB_STATE_SUCCEEDED, final.error
    assert final.step == 2 and final.last_checkpoint.endswith("step_000002")
    assert (tmp_path / "run" / "report.md").exists()
    listed = trainer_stub.ListJobs(trainer_service_pb2.ListJobsRequest(), timeout=10).jobs
    assert job.job_id in [j.job_id for j in listed]


def test_stop_job_ends_early_with_checkpoint(trainer_stub, tmp_path):
    req = trainer_service_pb2.SubmitJobRequest(
        config_yaml=_config(tmp_path, 50),
        overrides=[f"output.dir={tmp_path / 'run'}", "environment.max_turns=2", "rollout.eval_every=0"],
    )
    job = trainer_stub.SubmitJob(req, timeout=60).job
    kinds = []
    for rec in trainer_stub.StreamMetrics(
        trainer_service_pb2.StreamMetricsRequest(job_id=job.job_id), timeout=600
    ):
        kinds.append(rec.record.kind)
        if rec.record.kind == "train":
            break
    assert "train" in kinds, trainer_stub.GetJob(
        trainer_service_pb2.GetJobRequest(job_id=job.job_id)
    ).job.error
    trainer_stub.StopJob(trainer_service_pb2.StopJobRequest(job_id=job.job_id), timeout=10)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        state = trainer_stub.GetJob(trainer_service_pb2.GetJobRequest(job_id=job.job_id), timeout=10).job
        if state.state not in (trainer_pb2.JOB_STATE_PENDING, trainer_pb2.JOB_STATE_RUNNING):
            break
        time.sleep(0.5)
    assert state.state == trainer_pb2.JOB_STATE_STOPPED, state.error or state
    assert 1 <= state.step < 50 and state.last_checkpoint


def test_bad_requests_get_typed_errors(trainer_stub):
    with pytest.raises(grpc.RpcError) as info:
        trainer_stub.GetJob(trainer_service_pb2.GetJobRequest(job_id="nope"), timeout=10)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND and "nope" in info.value.details()
    with pytest.raises(grpc.RpcError) as info:
        trainer_stub.SubmitJob(
            trainer_service_pb2.SubmitJobRequest(config_yaml="training_name: x\nbogus: 1\n"), timeout=30
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "bogus" in info.value.details()
    cfg = (ROOT / "examples" / "tiny.yaml").read_text().replace('"tiny-llama"', '"no-such/model-7b"')
    with pytest.raises(grpc.RpcError) as info:
        trainer_stub.SubmitJob(trainer_service_pb2.SubmitJobRequest(config_yaml=cfg), timeout=30)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND and "no-such/model-7b" in info.value.details()
    with pytest.raises(grpc.RpcError) as info:
        trainer_stub.SaveCheckpoint(trainer_service_pb2.SaveCheckpointRequest(job_id="nope"), timeout=10)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_configs_naming_user_code_are_refused_by_default(trainer_stub):
    cfg = (
        (ROOT / "examples" / "tiny.yaml")
        .read_text()
        .replace('env_name: "collaborative_task_solving"', 'env_name: "my_envs.py:make_env"')
    )
    assert "my_envs.py:make_env" in cfg
    with pytest.raises(grpc.RpcError) as info:
        trainer_stub.SubmitJob(trainer_service_pb2.SubmitJobRequest(config_yaml=cfg), timeout=30)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "environment.env_name=my_envs.py:make_env" in info.value.details()


@pytest.mark.parametrize("source", ["external", "mixed"])
def test_a_submitted_job_serves_its_policies_and_trains_on_reported_episodes(trainer_stub, tmp_path, source):
    """The TrainerService path of the inference gateway: the job's gateway address is in its run directory, an
    SDK client (gRPC) plays and rewards external episodes, and the job's one update trains on them (``mixed``:
    on them and on the 4 episodes the job played itself)."""
    import json

    import marti

    run = tmp_path / "run"
    req = trainer_service_pb2.SubmitJobRequest(
        config_yaml=_config(tmp_path, 1),
        overrides=[f"output.dir={run}", f"rollout.source={source}", "external.episodes_per_step=2",
                   "rollout.eval_every=0", "external.wait_timeout_s=300", "environment.max_turns=2"],
    )  # fmt: skip
    job = trainer_stub.SubmitJob(req, timeout=60).job
    deadline = time.monotonic() + 300
    while not (run / "gateway.json").exists():
        state = trainer_stub.GetJob(trainer_service_pb2.GetJobRequest(job_id=job.job_id), timeout=10).job
        assert state.state != trainer_pb2.JOB_STATE_FAILED, state.error
        assert time.monotonic() < deadline, "no gateway.json"
        time.sleep(0.5)
    address = json.loads((run / "gateway.json").read_text())
    assert address["http"].startswith("http://") and address["http"].endswith("/v1")
    with marti.InferenceClient(address["grpc"]) as gw:
        assert {"agent_1", "agent_2"} <= {m.id for m in gw.models()}
        for i in range(2):
            for agent in ("agent_1", "agent_2"):
                out = gw.generate(
                    agent, text="plan the work", max_tokens=4, episode_id=f"ep{i}", group_id="g"
                )
                assert len(out.choices[0].token_ids) == len(out.choices[0].logprobs) > 0
            gw.report_reward(f"ep{i}", {"agent_1": float(i), "agent_2": 1.0 - i}, group_id="g", group_size=2)
    records = list(
        trainer_stub.StreamMetrics(trainer_service_pb2.StreamMetricsRequest(job_id=job.job_id), timeout=600)
    )
    final = trainer_stub.GetJob(trainer_service_pb2.GetJobRequest(job_id=job.job_id), timeout=10).job
    assert final.state == trainer_pb2.JOB_STATE_SUCCEEDED, final.error
    train = [r.record for r in records if r.record.kind == "train"]
    assert train and train[-1].values["agent_1/external_items"] == 2.0
    assert train[-1].values["agent_1/items"] == (2.0 if source == "external" else 6.0)
    assert train[-1].values["gateway/released"] == 2.0 and train[-1].values["agent_1/policy_version"] == 1.0
    assert not (run / "gateway.json").exists()  # removed when the gateway stopped
