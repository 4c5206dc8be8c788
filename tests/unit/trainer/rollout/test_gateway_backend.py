"""The inference gateway's side of the trainer: serving calls on a policy worker with the caller's sampling
parameters, resident older versions (``agent@VERSION``), the driver-side backend, the ``gateway`` / ``external``
config keys and the learner's wait for external episodes."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from marti.config import load_config
from marti.errors import CancelledError, DeadlineExceededError, InvalidArgumentError, NotFoundError
from marti.types.inference import Generation, SamplingParams
from marti.types.trajectory import Trajectory, Turn
from services.gateway.core.limits import GatewayLimits
from services.trainer.data.batch_reader import BatchReader
from services.trainer.data.external import ExternalEpisodes
from services.trainer.data.table_sampler import BatchSummary, TableSampler
from services.trainer.job.connections.addresses import Addresses
from services.trainer.job.connections.gateway_host import gateway_limits
from services.trainer.job.run.loop import TrainingLoop
from services.trainer.models.policy import MultiAgentPolicy
from services.trainer.ray.policy_worker import PolicyWorker, policy_actor_config, policy_layout
from services.trainer.ray.runtime import RayRuntime
from services.trainer.rollout.engines.generation import ResidentWeights
from services.trainer.rollout.engines.hf import HFRolloutEngine
from services.trainer.rollout.serving.gateway_backend import EngineBackend, TrainerBackend
from tests.trainer_data import one_turn

ROOT = Path(__file__).resolve().parents[4]
TINY = ROOT / "examples" / "tiny.yaml"
GREEDY = SamplingParams(max_new_tokens=6, temperature=0.0)
PROMPTS = [[1, 450, 3303, 318], [1, 2061, 1110]]


def _cfg(*overrides: str):
    return load_config(TINY, ["rollout.max_new_tokens=4", *overrides])


def _samples(worker: PolicyWorker, agent: str) -> list[Trajectory]:
    """A GRPO group whose rewards differ, so an update moves the weights."""
    gens = worker.serve(agent, PROMPTS * 2, SamplingParams(max_new_tokens=4, seed=1), None)
    return [
        one_turn(g.prompt_token_ids, g.response_token_ids, float(i % 2), 0, list(g.response_logprobs))
        for i, g in enumerate(gens)
    ]


def _reference(cfg, agent: str, weights: dict[str, torch.Tensor], version: int) -> list[Generation]:
    """What a fresh engine loaded with ``weights`` samples greedily."""
    policy = MultiAgentPolicy(policy_layout(cfg), device="cpu")
    engine = HFRolloutEngine.from_policy(policy, copy_weights=True)
    engine.update_weights(agent, weights, version)
    with torch.no_grad():
        return engine.generate(agent, PROMPTS, GREEDY)


@pytest.fixture(scope="module")
def served_worker():
    """A policy worker with the gateway on (3 resident versions), updated twice; each version's weights."""
    cfg = _cfg("gateway.enabled=true", "gateway.resident_versions=3", "learning_rate=0.05")
    worker = PolicyWorker(policy_actor_config(cfg), num_threads=1)
    weights = {0: worker.weights_for_sync("agent_1")[0]}
    for v in (1, 2):
        stats = worker.train("agent_1", _samples(worker, "agent_1"))
        assert stats["policy_version"] == float(v)
        weights[v] = worker.weights_for_sync("agent_1")[0]
    return cfg, worker, weights


def test_the_engine_owns_its_weights_when_the_gateway_serves(served_worker):
    _, worker, _ = served_worker
    assert worker.engine_owns_weights
    assert worker.serving_state()["resident"] == {"agent_1": [0, 1, 2], "agent_2": [0]}
    plain = PolicyWorker(policy_actor_config(_cfg()), num_threads=1)
    assert not plain.engine_owns_weights and plain.resident is None
    assert plain.serving_state()["resident"] == {"agent_1": [0], "agent_2": [0]}


def test_each_resident_version_serves_its_own_weights(served_worker):
    cfg, worker, weights = served_worker
    assert any(not torch.equal(weights[0][k], weights[2][k]) for k in weights[0])  # the updates moved them
    current = worker.serve("agent_1", PROMPTS, GREEDY, None)
    assert {g.policy_version for g in current} == {2}
    for v in (0, 1, 2):
        got = worker.serve("agent_1", PROMPTS, GREEDY, v)
        want = _reference(cfg, "agent_1", weights[v], v)
        assert [g.policy_version for g in got] == [v, v]
        assert [g.response_token_ids for g in got] == [g.response_token_ids for g in want]
        for a, b in zip(got, want, strict=True):
            assert a.response_logprobs == pytest.approx(b.response_logprobs, abs=1e-5)
    old = worker.serve("agent_1", PROMPTS, GREEDY, 0)
    assert (
        max(
            abs(x - y)
            for a, b in zip(old, current, strict=True)
            for x, y in zip(a.response_logprobs, b.response_logprobs, strict=False)
        )
        > 1e-6
    ), "versions 0 and 2 sample alike: the test would not tell them apart"
    after = worker.serve("agent_1", PROMPTS, GREEDY, None)  # a pinned call restored the current weights
    assert [(g.response_token_ids, g.response_logprobs, g.policy_version) for g in after] == [
        (g.response_token_ids, g.response_logprobs, g.policy_version) for g in current
    ]
    assert worker.serve("agent_2", PROMPTS, GREEDY, 0)[0].policy_version == 0  # another agent, untouched


def test_evicted_and_unknown_versions_are_not_found(served_worker):
    _, worker, _ = served_worker
    worker.train("agent_1", _samples(worker, "agent_1"))  # version 3: version 0 is evicted
    assert worker.serving_state()["resident"]["agent_1"] == [1, 2, 3]
    with pytest.raises(NotFoundError, match=r"version 0 of agent 'agent_1' is not resident.*\[1, 2, 3\]"):
        worker.serve("agent_1", PROMPTS, GREEDY, 0)
    with pytest.raises(NotFoundError):
        worker.serve("agent_1", PROMPTS, GREEDY, 7)
    with pytest.raises(NotFoundError):
        worker.serve("nobody", PROMPTS, GREEDY, None)
    assert worker.serve("agent_1", PROMPTS, GREEDY, 1)[0].policy_version == 1


def test_a_call_in_flight_when_an_update_lands_finishes_on_its_version(served_worker):
    _, worker, _ = served_worker
    before = worker.versions()["agent_1"]
    samples = _samples(worker, "agent_1")
    out: list[Generation] = []
    call = threading.Thread(
        target=lambda: out.extend(
            worker.serve("agent_1", PROMPTS * 8, SamplingParams(max_new_tokens=48, seed=0), None)
        )
    )
    call.start()
    deadline = time.monotonic() + 30
    while not worker._engine_lock.locked() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert worker._engine_lock.locked(), "the call never took the engine lock"
    stats = worker.train("agent_1", samples)  # its sync waits for the call
    call.join()
    assert stats["policy_version"] == before + 1
    assert {g.policy_version for g in out} == {before}
    assert worker.serve("agent_1", PROMPTS, GREEDY, None)[0].policy_version == before + 1


def test_callers_sampling_parameters_are_used_not_the_configs(served_worker):
    _, worker, _ = served_worker
    gens = worker.serve("agent_1", PROMPTS, SamplingParams(max_new_tokens=2, temperature=0.0), None)
    assert all(len(g.response_token_ids) <= 2 for g in gens)
    with pytest.raises(InvalidArgumentError, match="max_model_len"):
        worker.serve("agent_1", PROMPTS, SamplingParams(max_new_tokens=100_000), None)


def test_rollout_actors_serve_resident_versions_too():
    from services.trainer.ray.rollout_worker import RolloutWorker, rollout_actor_config

    cfg = _cfg("gateway.enabled=true", "gateway.resident_versions=2")
    worker = RolloutWorker(rollout_actor_config(cfg), num_threads=1)
    v0 = {k: t.clone() for k, t in worker.policy.state_for_sync("agent_2").items()}
    v1 = {k: t + 0.05 for k, t in v0.items()}
    worker.update_weights("agent_2", v1, 1)
    assert worker.serving_state()["resident"] == {"agent_1": [0], "agent_2": [0, 1]}
    for v, w in ((0, v0), (1, v1)):
        got = worker.serve("agent_2", PROMPTS, GREEDY, v)
        want = _reference(cfg, "agent_2", w, v)
        assert [g.response_token_ids for g in got] == [g.response_token_ids for g in want]
        assert [g.policy_version for g in got] == [v, v]
    assert worker.serve("agent_2", PROMPTS, GREEDY, None)[0].policy_version == 1
    worker.update_weights("agent_2", v0, 2)
    with pytest.raises(NotFoundError):
        worker.serve("agent_2", PROMPTS, GREEDY, 0)


def test_gateway_calls_go_to_the_agents_policy_actor_or_round_robin_to_rollout_actors():
    runtime = RayRuntime(_cfg())
    runtime._owner = {"agent_1": "policy-1", "agent_2": "policy-2"}
    assert [runtime._serving_actor(a) for a in ("agent_1", "agent_2")] == ["policy-1", "policy-2"]
    with pytest.raises(NotFoundError):
        runtime._serving_actor("agent_9")
    runtime._rollout = ["rollout-0", "rollout-1"]
    assert [runtime._serving_actor("agent_1") for _ in range(3)] == ["rollout-0", "rollout-1", "rollout-0"]


def test_resident_weights_keep_the_last_versions_as_copies():
    held = ResidentWeights(2)
    w = {"x": torch.zeros(2)}
    held.remember(["a", "b"], 0, w)
    w["x"] += 1  # the live tensor moves on; the copy does not
    held.remember(["a"], 1, w)
    held.remember(["a"], 2, {"x": torch.full((2,), 2.0)})
    assert held.versions("a") == [1, 2] and held.versions("b") == [0]
    assert held.get("a", 0) is None and torch.equal(held.get("b", 0)["x"], torch.zeros(2))
    held.remember(["a"], 1, {"x": torch.ones(2)})  # a checkpoint load back to version 1 forgets version 2
    assert held.versions("a") == [1]


def test_engine_backend_serves_pinned_versions_of_an_engine():
    cfg = _cfg()
    policy = MultiAgentPolicy(policy_layout(cfg), device="cpu")
    engine = HFRolloutEngine.from_policy(policy, copy_weights=True)
    lock = threading.Lock()
    resident = ResidentWeights(2)
    v0 = policy.state_for_sync("agent_1")
    resident.remember(["agent_1"], 0, v0)
    v1 = {k: t + 0.05 for k, t in v0.items()}
    engine.update_weights("agent_1", v1, 1)
    resident.remember(["agent_1"], 1, v1)
    tok = policy.tokenizer("agent_1")
    backend = EngineBackend(engine, {"agent_1": tok, "agent_2": tok}, lock, resident)
    assert backend.resident_versions("agent_1") == [0, 1] and backend.resident_versions("agent_2") == [0]
    assert backend.max_model_len("agent_1") == 2048
    got = backend.generate("agent_1", PROMPTS, GREEDY, 0)
    want = _reference(cfg, "agent_1", v0, 0)
    assert [g.response_token_ids for g in got] == [g.response_token_ids for g in want]
    assert backend.generate("agent_1", PROMPTS, GREEDY, None)[0].policy_version == 1
    with pytest.raises(NotFoundError):
        backend.generate("agent_2", PROMPTS, GREEDY, 1)


class _FakeTokenizer:
    def __init__(self, offset: int) -> None:
        self.offset = offset

    def apply_chat_template(self, messages, add_generation_prompt, tokenize, return_dict):
        return [self.offset + len(m["content"]) for m in messages]

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [self.offset + ord(c) for c in text]}


class _FakeRuntime:
    def __init__(self) -> None:
        self.state = {
            "versions": {"a": 0, "b": 0},
            "resident": {"a": [0], "b": [0]},
            "max_model_len": {"a": 64, "b": 128},
        }
        self.calls: list[tuple] = []

    def serving_state(self):
        return self.state

    def serve(self, agent, prompts, sampling, version):
        self.calls.append((agent, prompts, sampling, version))
        v = self.state["versions"][agent] if version is None else version
        return [Generation(p, [9], [-0.5], "x", "stop", v, agent) for p in prompts]


def test_trainer_backend_mirrors_the_actors_and_uses_each_agents_tokenizer():
    runtime = _FakeRuntime()
    backend = TrainerBackend(runtime, ["a", "b"], {"a": _FakeTokenizer(0), "b": _FakeTokenizer(1000)})
    assert backend.agents() == ["a", "b"] and backend.versions() == {"a": 0, "b": 0}
    assert backend.chat_prompt("a", [{"role": "user", "content": "hey"}]) == [3]
    assert backend.chat_prompt("b", [{"role": "user", "content": "hey"}]) == [1003]
    assert backend.encode("b", "A") == [1065] and backend.max_model_len("b") == 128
    runtime.state = {**runtime.state, "versions": {"a": 2, "b": 0}, "resident": {"a": [1, 2], "b": [0]}}
    assert backend.resident_versions("a") == [0], "mirrored only on refresh"
    assert backend.refresh() == {"a": 2, "b": 0}
    assert backend.resident_versions("a") == [1, 2]
    gens = backend.generate("a", [[1, 2]], GREEDY, 1)
    assert runtime.calls == [("a", [[1, 2]], GREEDY, 1)] and gens[0].policy_version == 1
    with pytest.raises(NotFoundError):
        backend.resident_versions("c")
    with pytest.raises(NotFoundError):
        TrainerBackend(runtime, ["a", "b"], {"a": _FakeTokenizer(0)})


# ---------------------------------------------------------------------------------------------- config keys
def test_gateway_keys_map_onto_the_gateway_limits():
    cfg = _cfg(
        "gateway.max_batch=3", "gateway.max_wait_ms=7.5", "gateway.max_queue=9", "gateway.max_n=2",
        "gateway.max_open_episodes=11", "gateway.max_calls_per_episode=5", "gateway.resident_versions=4",
        "external.episode_timeout_s=12.5", "gateway.max_request_bytes=1000", "gateway.max_stop=2",
        "gateway.max_stop_chars=3", "gateway.max_id_chars=4", "gateway.max_group_size=6",
        "gateway.max_backlog_episodes=7", "gateway.report_wait_s=0.5",
    )  # fmt: skip
    assert gateway_limits(cfg) == GatewayLimits(
        max_batch=3, max_wait_ms=7.5, max_queue=9, max_n=2, max_open_episodes=11, max_calls_per_episode=5,
        episode_timeout_s=12.5, resident_versions=4, max_request_bytes=1000, max_stop=2, max_stop_chars=3,
        max_id_chars=4, max_group_size=6, max_backlog_episodes=7, report_wait_s=0.5,
    )  # fmt: skip
    assert gateway_limits(_cfg()) == GatewayLimits(resident_versions=1, episode_timeout_s=600.0)


def test_external_sources_turn_the_gateway_on_and_set_the_items_per_update():
    base = _cfg()
    assert not base.gateway.enabled and base.items_per_step == base.rollout.episodes_per_step == 4
    ext = _cfg("rollout.source=external", "external.episodes_per_step=6")
    assert ext.gateway.enabled and ext.items_per_step == 6 and ext.builtin_episodes_per_step == 0
    mixed = _cfg("rollout.source=mixed", "external.episodes_per_step=6", "gateway.enabled=false")
    assert mixed.gateway.enabled and mixed.items_per_step == 10
    assert _cfg("external.episodes_per_step=6").items_per_step == 4  # builtin: no external items
    with pytest.raises(InvalidArgumentError, match="rollout.source"):
        _cfg("rollout.source=outside")


def test_resident_versions_default_to_the_largest_staleness_bound_plus_one():
    assert _cfg().gateway_resident_versions == 1
    assert _cfg("rollout.max_staleness=2", "agents.0.max_staleness=1").gateway_resident_versions == 3
    assert _cfg("rollout.max_staleness=2", "gateway.resident_versions=5").gateway_resident_versions == 5
    with pytest.raises(InvalidArgumentError, match="resident_versions"):
        _cfg("gateway.resident_versions=0")


def test_gateway_ports_are_validated():
    with pytest.raises(InvalidArgumentError, match="both 8000"):
        _cfg("gateway.http_port=8000", "gateway.grpc_port=8000")
    with pytest.raises(InvalidArgumentError, match="http_port"):
        _cfg("gateway.http_port=70000")
    assert _cfg("gateway.http_port=0", "gateway.grpc_port=0").gateway.http_port == 0


def test_the_jobs_gateway_sink_stops_waiting_for_room_when_the_gateway_closes(tmp_path, monkeypatch):
    """The sink ``_start_gateway`` gives the gateway inserts each reported episode as external and passes the
    gateway's ``closing`` event, so an insert waiting for room in a full table ends when the gateway closes."""
    from services.gateway.core.gateway import Gateway

    made: dict = {}

    class Server:
        def __init__(self, gateway, **kwargs):
            made["gateway"] = gateway

        def start(self):
            return "http://gateway/v1", "gateway:1"

    class Writer:
        def insert_episode(self, episode, **kwargs):
            made["insert"] = (episode, kwargs)

    class Backend:
        def agents(self):
            return ["agent_1"]

        def versions(self):
            return {"agent_1": 0}

        def resident_versions(self, agent):
            return [0]

        def generate(self, agent, prompts, sampling, version):
            raise AssertionError("nothing is generated here")

    monkeypatch.setattr("services.gateway.server.GatewayServer", Server)
    monkeypatch.setattr(
        "services.trainer.rollout.serving.gateway_backend.TrainerBackend.for_job",
        lambda runtime, cfg: Backend(),
    )
    loop = TrainingLoop(
        _cfg("rollout.source=external"), Addresses("unused:1", "unused:1", "unused:1"), show_progress=False
    )
    loop.run_dir = tmp_path
    loop.writer = Writer()
    loop._start_gateway(None)
    gateway = made["gateway"]
    assert isinstance(gateway, Gateway) and gateway.sink is not None
    gateway.sink({"agent_1": "trajectory"})
    episode, kwargs = made["insert"]
    assert episode == {"agent_1": "trajectory"}
    assert kwargs == {"external": True, "stop": gateway.closing}


def test_gateway_calls_run_beside_updates_and_rollouts_on_the_actors():
    """A policy actor takes one more concurrent call per overlapping caller (a Ray actor option)."""
    assert RayRuntime(_cfg()).max_concurrency("policy") == 1
    assert RayRuntime(_cfg("gateway.enabled=true")).max_concurrency("policy") == 2
    assert RayRuntime(_cfg("gateway.enabled=true", "rollout.max_staleness=1")).max_concurrency("policy") == 3
    rollout = RayRuntime(_cfg("gateway.enabled=true", "ray.num_rollout_workers=1"))
    assert (rollout.max_concurrency("policy"), rollout.max_concurrency("rollout")) == (1, 2)
    assert RayRuntime(_cfg()).max_concurrency("reference") == 1


# ---------------------------------------------------------------------------------------------- external items
def _traj(eid: str, agent: str) -> Trajectory:
    turn = Turn(
        step=0, prompt_token_ids=[1, 2], response_token_ids=[3], response_logprobs=[-0.1], policy_version=0
    )
    return Trajectory(
        episode_id=eid, agent_id=agent, turns=[turn], group_id="g", episode_return=1.0,
        metadata={"source": "gateway"},
    )  # fmt: skip


class _TrickleStore:
    """A store whose table gets one item every ``every`` sample calls (the first on the first call)."""

    def __init__(self, every: int = 3, limit: int = 100) -> None:
        self.every, self.limit, self.calls, self.given = every, limit, 0, 0

    def sample_batch(self, table, count, **kwargs):
        self.calls += 1
        if (self.calls - 1) % self.every or self.given >= self.limit:
            raise DeadlineExceededError("no item")
        self.given += 1
        agent = table.split("/")[-1]
        return SimpleNamespace(
            items=[SimpleNamespace(trajectory=_traj(f"e{self.given}", agent))],
            stale_episode_ids=[],
            dropped_episode_ids=[],
        )


def _reader(store, sampler: TableSampler | None = None) -> BatchReader:
    """The job's reader, its sample calls on ``sampler`` (the learner's, which keeps the items; a new one on
    ``store`` by default)."""
    tables = {a: f"job/{a}" for a in ("agent_1", "agent_2")}
    sample = (sampler or TableSampler(store)).sample
    return BatchReader(sample, tables, lambda fn, w: fn(), ExternalEpisodes(list(tables)))


def test_take_waits_for_external_items_until_its_deadline():
    taken = _reader(_TrickleStore(every=3)).take("agent_1", 3, 0, deadline=time.monotonic() + 30)
    assert taken.item_ids == ["e1", "e2", "e3"]
    with pytest.raises(DeadlineExceededError, match="got 1 of the 2 items"):
        _reader(_TrickleStore(limit=1)).take("agent_1", 2, 0, deadline=time.monotonic() + 0.2)
    stop = threading.Event()
    stop.set()
    with pytest.raises(CancelledError, match="stopped"):
        _reader(_TrickleStore(limit=0)).take("agent_1", 1, 0, deadline=time.monotonic() + 30, stop=stop)


def test_an_update_missing_external_episodes_fails_naming_the_counts(tmp_path):
    cfg = _cfg(
        "rollout.source=external", "external.episodes_per_step=2", "external.wait_timeout_s=0.3",
        f"output.dir={tmp_path}",
    )  # fmt: skip
    loop = TrainingLoop(cfg, Addresses("unused:1", "unused:1", "unused:1"), show_progress=False)
    runtime = _Runtime(TableSampler(_TrickleStore(limit=4)))
    loop.reader = _reader(None, runtime.sampler)
    batches, metrics = loop._take_batches(runtime, 0, {"agent_1": 0, "agent_2": 0})
    assert metrics["agent_1/items"] == 2 and metrics["agent_1/external_items"] == 2
    assert metrics["agent_1/external_reward"] == 1.0 and len(batches["agent_1"]) == 2
    runtime = _Runtime(TableSampler(_TrickleStore(limit=1)))
    loop.reader = _reader(None, runtime.sampler)
    with pytest.raises(DeadlineExceededError) as err:
        loop._take_batches(runtime, 0, {"agent_1": 0, "agent_2": 0})
    msg = str(err.value)
    assert "got 1 of the 2 items" in msg and "external.episodes_per_step=2" in msg
    assert "external.wait_timeout_s=0.3s" in msg and "0 built-in episodes" in msg


class _Runtime:
    """What a step needs of the runtime: versions, the learner's sampler (in-process here, in the policy actor
    in a job) and an update that records what it trained on."""

    def __init__(self, sampler: TableSampler) -> None:
        self.sampler = sampler
        self.trained: dict[str, int] = {}

    def versions(self) -> dict[str, int]:
        return {"agent_1": 0, "agent_2": 0}

    def batch_summary(self, agent: str, current_version: int) -> BatchSummary:
        return self.sampler.summary(agent, current_version)

    def train_taken(self, agent: str, keep: list[int] | None = None) -> dict[str, float]:
        self.trained[agent] = len(self.sampler.pop(agent, keep))
        return {"policy_version": 1.0, "policy_loss": 0.5}


@pytest.mark.parametrize(
    ("source", "rollouts", "items"), [("external", 0, 3), ("mixed", 1, 7), ("builtin", 1, 4)]
)
def test_a_step_plays_and_takes_what_its_rollout_source_says(tmp_path, source, rollouts, items):
    cfg = _cfg(f"rollout.source={source}", "external.episodes_per_step=3", f"output.dir={tmp_path}")
    loop = TrainingLoop(cfg, Addresses("unused:1", "unused:1", "unused:1"), show_progress=False)
    runtime = _Runtime(TableSampler(_TrickleStore(every=1)))
    loop.reader = _reader(None, runtime.sampler)
    played: list[int] = []
    loop._rollout = lambda runtime, step: (played.append(step), ([], 0.25))[1]  # no env: no built-in episodes
    metrics = loop._train_step(runtime, 0)
    assert len(played) == rollouts
    assert runtime.trained == {"agent_1": items, "agent_2": items}
    assert metrics["agent_1/items"] == items and metrics["agent_1/policy_loss"] == 0.5
    assert ("agent_1/external_items" in metrics) == (source != "builtin")
    assert ("time/external_wait_s" in metrics) == (source != "builtin")
    assert "team/reward" not in metrics  # no built-in episode results: no episode metrics, and no crash


def test_the_untrained_count_at_the_end_says_which_were_too_stale_to_train(caplog):
    """An episode reported past the staleness bound sits in the tables until an update drops it: the job's last
    warning counts it among those left and says that some were stale (gateway/stale_reported), not only that they
    came after the last update."""
    from services.trainer.job.connections.gateway_host import GatewayHost

    host = GatewayHost(_cfg("rollout.source=external"), token=None)
    external = ExternalEpisodes(["agent_1"])
    external.inserting("agent_1", "late")
    external.inserting("agent_1", "stale")
    gateway = SimpleNamespace(stats=lambda: {"stale_reported": 1.0, "backlog_lost_at_close": 0.0})
    with caplog.at_level("WARNING", logger="marti.trainer"):
        host.count_untrained(gateway, external)
    assert host.untrained_external == 2
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "2 reported episodes were never trained" in said
    assert "1 reported episodes were already past the staleness bound" in said, said


def test_the_untrained_count_of_a_builtin_job_includes_episodes_held_or_queued_at_close(caplog):
    """With rollout.source=builtin no reported episode trains: the released ones and those a closing gateway lost
    (a group still waiting for members, a backlog) are all counted."""
    from services.trainer.job.connections.gateway_host import GatewayHost

    host = GatewayHost(_cfg("rollout.source=builtin", "gateway.enabled=true"), token=None)
    gateway = SimpleNamespace(
        stats=lambda: {"released": 2.0, "held_lost_at_close": 1.0, "backlog_lost_at_close": 1.0}
    )
    with caplog.at_level("WARNING", logger="marti.trainer"):
        host.count_untrained(gateway, None)
    assert host.untrained_external == 4
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "4 reported episodes were never trained: 2 released and 2 held or queued" in said, said
