"""Routing through the gateway with LoRA adapters: each agent's calls reach its own adapter and version, and an
agent's update never changes another agent's outputs.

Comparable gateways were reported to serve the base model instead of the adapter. Here two agents are LoRA
adapters on one shared tiny base model (``examples/tiny.yaml``, ``policy.mode: lora``), served by a policy worker
(the actor class a job runs) behind :class:`~services.trainer.rollout.serving.gateway_backend.TrainerBackend`, a
:class:`~services.gateway.server.GatewayServer` and the official ``openai`` client. Every greedy answer is
compared with a fresh engine loaded with exactly that agent's weights of that version. The same setup, with a real
experience store behind the gateway, checks that an update landing while a call generates waits for it, and that
the call keeps the version it was dispatched with everywhere (answer, trace, staleness verdict, store item).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
import torch

from marti.clients.experience import ExperienceSharingClient
from marti.config import load_config
from marti.rpc.testing import serve_in_thread
from marti.types.inference import SamplingParams
from services.experience_store.__main__ import make_spec
from services.experience_store.settings import StoreSettings
from services.gateway.core.gateway import Gateway
from services.gateway.core.limits import GatewayLimits
from services.gateway.server import GatewayServer
from services.trainer.data.episode_writer import EpisodeWriter
from services.trainer.data.external import ExternalEpisodes
from services.trainer.data.tables import claim_tables
from services.trainer.models.loading import load_tokenizer
from services.trainer.models.policy import MultiAgentPolicy
from services.trainer.ray.policy_worker import PolicyWorker, policy_actor_config, policy_layout
from services.trainer.rollout.engines.hf import HFRolloutEngine
from services.trainer.rollout.serving.gateway_backend import TrainerBackend
from tests.trainer_data import one_turn

ROOT = Path(__file__).resolve().parents[3]
TOKEN = "routing-token"
AGENTS = ("agent_1", "agent_2")
PROMPT = [1, 450, 3303, 318, 2061, 1110]
MAX_TOKENS = 6


class _Runtime:
    """What :class:`TrainerBackend` needs of a job's runtime, over one policy worker in this process."""

    def __init__(self, worker: PolicyWorker) -> None:
        self.worker = worker

    def serve(self, agent, prompts, sampling, version):
        return self.worker.serve(agent, prompts, sampling, version)

    def serving_state(self):
        return self.worker.serving_state()


def _reference(
    cfg, agent: str, weights: dict[str, torch.Tensor], version: int
) -> tuple[list[int], list[float]]:
    """The greedy answer to PROMPT of a fresh engine loaded with ``weights`` for ``agent``."""
    return _references(cfg, agent, (weights, version))[0]


def _references(
    cfg, agent: str, *versions: tuple[dict[str, torch.Tensor], int]
) -> list[tuple[list[int], list[float]]]:
    """The greedy answers to PROMPT of one fresh engine loaded with each ``(weights, version)`` for ``agent`` in
    turn (versions ascending)."""
    policy = MultiAgentPolicy(policy_layout(cfg), device="cpu")
    engine = HFRolloutEngine.from_policy(policy, copy_weights=True)
    out = []
    for weights, version in versions:
        engine.update_weights(agent, weights, version)
        with torch.no_grad():
            (g,) = engine.generate(
                agent, [PROMPT], SamplingParams(max_new_tokens=MAX_TOKENS, temperature=0.0)
            )
        out.append((list(g.response_token_ids), list(g.response_logprobs)))
    return out


def _samples(worker: PolicyWorker, agent: str) -> list:
    """A group of ``agent``'s current answers whose rewards differ (training on it moves its adapter)."""
    gens = worker.serve(agent, [PROMPT] * 4, SamplingParams(max_new_tokens=4, seed=1), None)
    return [
        one_turn(g.prompt_token_ids, g.response_token_ids, float(i % 2), 0, list(g.response_logprobs))
        for i, g in enumerate(gens)
    ]


def _update(worker: PolicyWorker, agent: str) -> None:
    """One training step of ``agent`` (its adapter moves; the engine gets it as the next version)."""
    worker.train(agent, _samples(worker, agent))


def _answer(client: openai.OpenAI, model: str) -> tuple[list[int], list[float], int]:
    r = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0.0, logprobs=1, stop=[]
    )
    c = r.choices[0]
    return c.model_extra["token_ids"], c.logprobs.token_logprobs, r.model_extra["policy_version"]


def _apart(a: tuple[list[int], list[float], int], b: tuple[list[int], list[float], int]) -> bool:
    """Two greedy answers differ in their tokens or, beyond noise, their log-probabilities."""
    return a[0] != b[0] or max(abs(x - y) for x, y in zip(a[1], b[1], strict=True)) > 1e-4


def _same(got: tuple[list[int], list[float], int], want: tuple[list[int], list[float]]) -> bool:
    return got[0] == want[0] and got[1] == pytest.approx(want[1], abs=1e-4)


def test_each_agents_calls_reach_its_own_adapter_and_an_update_leaves_the_other_agent_unchanged():
    cfg = load_config(
        ROOT / "examples" / "tiny.yaml",
        [
            "gateway.enabled=true",
            "gateway.resident_versions=2",
            "learning_rate=0.05",
            "rollout.max_new_tokens=4",
        ],
    )
    assert cfg.policy.mode == "lora" and list(AGENTS) == [a.name for a in cfg.agents]
    worker = PolicyWorker(policy_actor_config(cfg), num_threads=1)
    tok = load_tokenizer()
    backend = TrainerBackend(_Runtime(worker), list(AGENTS), {a: tok for a in AGENTS})
    server = GatewayServer(Gateway(backend, GatewayLimits(max_wait_ms=1, resident_versions=2)), token=TOKEN)
    http_url, _ = server.start()
    try:
        client = openai.OpenAI(base_url=http_url, api_key=TOKEN, max_retries=0, timeout=120)
        v0 = {a: _answer(client, a) for a in AGENTS}
        for a in AGENTS:
            assert v0[a][2] == 0 and _same(v0[a], _reference(cfg, a, worker.weights_for_sync(a)[0], 0)), a

        # agent_1's update: its calls now reach its new adapter; agent_1@0 its old one; agent_2 is untouched
        w1 = worker.weights_for_sync("agent_1")[0]
        w1 = {k: t.clone() for k, t in w1.items()}
        _update(worker, "agent_1")
        backend.refresh()  # what the job does after every step's syncs
        new = worker.weights_for_sync("agent_1")[0]
        assert any(not torch.equal(w1[k], new[k]) for k in new), "the update did not move agent_1's adapter"
        one = {a: _answer(client, a) for a in AGENTS}
        assert one["agent_1"][2] == 1 and _apart(one["agent_1"], v0["agent_1"]), (
            "agent_1 still serves version 0"
        )
        assert _same(one["agent_1"], _reference(cfg, "agent_1", new, 1)), (
            "agent_1 is not served its own adapter"
        )
        assert one["agent_2"] == v0["agent_2"], "agent_1's update changed agent_2's outputs"
        assert _apart(one["agent_1"], one["agent_2"]), "the test could not tell the two adapters apart"
        pinned = _answer(client, "agent_1@0")
        assert pinned[2] == 0 and _same(pinned, _reference(cfg, "agent_1", w1, 0))

        # agent_2's update: the same the other way round
        _update(worker, "agent_2")
        backend.refresh()
        two = {a: _answer(client, a) for a in AGENTS}
        assert two["agent_2"][2] == 1 and _apart(two["agent_2"], v0["agent_2"])
        assert _same(two["agent_2"], _reference(cfg, "agent_2", worker.weights_for_sync("agent_2")[0], 1))
        assert two["agent_1"] == one["agent_1"], "agent_2's update changed agent_1's outputs"
        assert [m.id for m in client.models.list().data] == ["agent_1", "agent_1@0", "agent_1@1", "agent_2",
                                                            "agent_2@0", "agent_2@1"]  # fmt: skip
    finally:
        server.stop()


class _WatchedLock:
    """The policy worker's engine lock, noting the name of every thread that asks for it (a sync waiting)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.asked: list[str] = []

    def __enter__(self) -> _WatchedLock:
        self.asked.append(threading.current_thread().name)
        self._lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def _hold_at_third_forward(model: torch.nn.Module, started: threading.Event, release: threading.Event):
    """Block the model's third forward pass (some tokens are sampled by then) until ``release``; the hook's
    handle (remove it after)."""
    calls = [0]

    def hook(module, args):
        calls[0] += 1
        if calls[0] == 3:
            started.set()
            assert release.wait(60), "the test never released the held generation"

    return model.get_input_embeddings().register_forward_pre_hook(hook)


@pytest.fixture
def store_address(tmp_path):
    settings = StoreSettings(port=0, data_dir=str(tmp_path / "data"), default_timeout_ms=2000)
    with serve_in_thread(lambda: [make_spec(settings)[0]], settings) as server:
        yield server.address


def test_a_sync_landing_while_a_call_generates_waits_and_the_call_keeps_its_dispatch_version(store_address):
    """A traced call starts on version 0; agent_1's update lands while it generates. The sync waits for the call,
    whose answer, trace, staleness verdict and store record all say version 0, and whose tokens are version 0's
    weights' (a fresh engine loaded with them gives the same greedy answer; version 1's differ)."""
    cfg = load_config(
        ROOT / "examples" / "tiny.yaml",
        ["gateway.enabled=true", "learning_rate=0.05", "rollout.max_new_tokens=4"],
    )
    worker = PolicyWorker(policy_actor_config(cfg), num_threads=1)
    lock = worker._engine_lock = _WatchedLock()  # serve and the engine sync take it as before
    tok = load_tokenizer()
    backend = TrainerBackend(_Runtime(worker), list(AGENTS), {a: tok for a in AGENTS})
    store = ExperienceSharingClient("trainer", store_address, timeout_s=10)
    tables, _ = claim_tables(store, "job", dict.fromkeys(AGENTS, 0), 100, lambda fn, what: fn())
    writer = EpisodeWriter(store, tables, lambda fn, what: fn(), ExternalEpisodes(list(AGENTS)))
    gateway = Gateway(
        backend,
        GatewayLimits(max_wait_ms=1),
        sink=lambda episode: writer.insert_episode(episode, external=True),
        max_staleness=dict.fromkeys(AGENTS, 0),
    )
    server = GatewayServer(gateway, token=TOKEN)
    root = server.start()[0].removesuffix("/v1")
    try:
        samples = _samples(worker, "agent_1")
        w0 = {k: t.clone() for k, t in worker.weights_for_sync("agent_1")[0].items()}
        started, release, answers = threading.Event(), threading.Event(), {}
        client = openai.OpenAI(
            base_url=f"{root}/episodes/ep-held/v1", api_key=TOKEN, max_retries=0, timeout=120
        )
        hold = _hold_at_third_forward(worker.engine._agents["agent_1"].model, started, release)
        call = threading.Thread(target=lambda: answers.update(held=_answer(client, "agent_1")))
        call.start()
        assert started.wait(60), "the call never reached the engine"
        sync = threading.Thread(target=worker.train, args=("agent_1", samples), name="weight-sync")
        sync.start()
        deadline = time.monotonic() + 60
        while "weight-sync" not in lock.asked and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "weight-sync" in lock.asked, "the update never asked for the engine lock"
        time.sleep(0.2)  # the sync asked for the lock while the call generates: it must still be waiting
        assert worker.policy.version("agent_1") == 1 and worker.engine.policy_version("agent_1") == 0
        assert sync.is_alive(), "the weight sync did not wait for the call in flight"
        release.set()
        call.join(60)
        sync.join(60)
        hold.remove()
        assert not call.is_alive() and not sync.is_alive() and worker.engine.policy_version("agent_1") == 1
        backend.refresh()  # what the job does after every step's syncs

        held = answers["held"]
        ref0, ref1 = _references(cfg, "agent_1", (w0, 0), (worker.weights_for_sync("agent_1")[0], 1))
        assert held[2] == 0, "the call is not stamped with the version it was dispatched with"
        assert _same(held, ref0), "the call was not sampled by version 0's weights"
        assert _apart(held, ref1), "the test cannot tell the two versions apart"
        assert gateway.tracker.turn_versions("ep-held") == {"agent_1": [0]}
        following = openai.OpenAI(
            base_url=f"{root}/episodes/ep-next/v1", api_key=TOKEN, max_retries=0, timeout=120
        )
        after = _answer(following, "agent_1")
        assert after[2] == 1 and _same(after, ref1)

        auth = {"Authorization": f"Bearer {TOKEN}"}
        reports = {
            eid: httpx.post(
                f"{root}/v1/episodes/{eid}/reward", json={"rewards": {"agent_1": 1.0}}, headers=auth
            )
            for eid in ("ep-held", "ep-next")
        }
        assert [r.status_code for r in reports.values()] == [200, 200], [r.text for r in reports.values()]
        assert reports["ep-held"].json()["stale"] == [
            {"episode_id": "ep-held", "agent": "agent_1", "policy_version": 0, "current_version": 1,
             "max_staleness": 0, "stale_calls": 1}
        ]  # fmt: skip
        assert "stale" not in reports["ep-next"].json()
        # the learner at version 1 takes both items: the table removes the held call's as stale by its record
        batch = store.sample_batch(
            tables["agent_1"], 2, timeout_s=2, current_policy_version=1, allow_partial=True
        )
        assert batch.stale_episode_ids == ["ep-held"]
        (item,) = [i.trajectory for i in batch.items]
        assert (item.episode_id, item.policy_version, item.turns[0].policy_version) == ("ep-next", 1, 1)
        assert item.turns[0].response_token_ids == after[0]
    finally:
        release.set()
        server.stop()
        store.close()
