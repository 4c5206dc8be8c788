"""RayRuntime actor groups: per-agent actors in per_agent mode, one team actor in lora mode, and reference /
critic actors of their own with ray.colocate_models=false."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from marti.clients.experience import ExperienceSharingClient
from marti.config import load_config
from marti.errors import UnavailableError
from marti.rpc.testing import serve_in_thread
from marti.types.trajectory import Trajectory
from services.experience_store.__main__ import make_spec
from services.experience_store.settings import StoreSettings
from services.trainer.data.tables import claim_tables
from services.trainer.ray.policy_worker import PolicyWorker, policy_actor_config
from services.trainer.ray.runtime import RayRuntime
from services.trainer.ray.table_access import StoreAccess
from tests.local_ray import local_ray
from tests.trainer_data import one_turn

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def _one_local_ray() -> Iterator[None]:
    """One local Ray for the module's 5 runtime starts (:func:`~tests.local_ray.local_ray`)."""
    with local_ray(ROOT / "examples" / "tiny.yaml"):
        yield


def test_lora_mode_uses_one_team_actor():
    cfg = load_config(ROOT / "examples" / "tiny.yaml")
    assert RayRuntime(cfg).groups() == [["agent_1", "agent_2"]]


@contextlib.contextmanager
def _store(tmp_path: Path) -> Iterator[tuple[ExperienceSharingClient, StoreAccess]]:
    """A real experience store on a free port with agent_1's table ``job/agent_1`` (staleness bound 10): the
    driver's client and what a policy actor needs to reach it."""
    settings = StoreSettings(port=0, data_dir=str(tmp_path / "store"), default_timeout_ms=2000)
    with serve_in_thread(lambda: [make_spec(settings)[0]], settings) as server:
        store = ExperienceSharingClient("trainer", server.address, timeout_s=10)
        claim_tables(store, "job", {"agent_1": 10}, 100, lambda fn, what: fn())
        try:
            yield store, StoreAccess(server.address)
        finally:
            store.close()


def _take_and_train(
    runtime: RayRuntime, store: ExperienceSharingClient, access: StoreAccess, samples: list[Trajectory]
) -> tuple[Any, Any, dict[str, float]]:
    """Insert ``samples`` into agent_1's table, then let its policy actor take them and train on all:
    ``(ids taken, batch summary, update statistics)``."""
    for t in samples:
        store.share_experience(t, table="job/agent_1")
    got = runtime.take_items("agent_1", "job/agent_1", len(samples), runtime.versions()["agent_1"], access)
    summary = runtime.batch_summary("agent_1", runtime.versions()["agent_1"])
    return got, summary, runtime.train_taken("agent_1", [r.index for r in summary.trained])


def _fixed_samples(seed: int, version: int = 0) -> list[Trajectory]:
    """Three one-turn samples of different lengths, drawn from ``seed``, as sampled by policy ``version``."""
    g = torch.Generator().manual_seed(seed)
    return [
        one_turn(
            torch.randint(10, 1000, (4 + i,), generator=g).tolist(),
            torch.randint(10, 1000, (5 - i,), generator=g).tolist(),
            float(i % 2),
            0,
            policy_version=version,
        )
        for i in range(3)
    ]


def test_separate_reference_and_critic_actors_match_the_colocated_layout(tmp_path, monkeypatch):
    """ray.colocate_models=false: a reference and a critic actor per trainable agent, none for a frozen one
    (agent_2: 3 actors per job, not 5); same numbers as colocated; resume. The driver's ``OMP_NUM_THREADS`` (3,
    more than any bundle here holds) is every kind of actor's torch threads."""
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    overrides = [
        "algorithm.advantage_estimator=gae",
        "algorithm.kl_coef=0.05",
        "algorithm.use_kl_loss=false",
        "micro_train_batch_size=1",
        "gradient_accumulation_steps=2",
        "agents.1.is_tuning=false",
    ]
    path = ROOT / "examples" / "tiny.yaml"
    colocated = PolicyWorker(policy_actor_config(load_config(path, overrides)), num_threads=1)
    runtime = RayRuntime(load_config(path, [*overrides, "ray.colocate_models=false"]))
    try:
        runtime.start()
        assert set(runtime.worker_pids) == {"policy_worker", "reference_agent_1", "critic_agent_1"}
        assert len(set(runtime.worker_pids.values())) == 3, "each model in its own actor process"
        assert {n: i["torch_threads"] for n, i in runtime.actor_info.items()} == dict.fromkeys(
            runtime.worker_pids, 3
        )
        with _store(tmp_path) as (store, access):
            for step in range(2):  # the KL is 0 until the policy has left its reference
                expected = colocated.train("agent_1", _fixed_samples(step))
                if step == 0:
                    stats = runtime.train("agent_1", _fixed_samples(step))
                else:  # the policy actor's own take: passed to the reference and critic actors by reference
                    stats = _take_and_train(runtime, store, access, _fixed_samples(step))[2]
                for key in ("policy_loss", "kl", "value_loss", "vf_clip_frac", "value_mean", "advantage_abs"):
                    assert stats[key] == pytest.approx(expected[key], rel=1e-4, abs=1e-6), (step, key)
        assert stats["kl"] != 0.0 and stats["value_loss"] > 0
        ckpt = tmp_path / "split"
        runtime.save(str(ckpt), {"step": 2})
        colocated.save(str(tmp_path / "colocated"), {"step": 2})
        split_w = load_file(str(ckpt / "policy" / "adapter-agent_1.safetensors"))
        colo_w = load_file(str(tmp_path / "colocated" / "policy" / "adapter-agent_1.safetensors"))
        assert split_w.keys() == colo_w.keys()
        for name, want in colo_w.items():
            torch.testing.assert_close(split_w[name], want, rtol=1e-4, atol=1e-6)
        for name, want in load_file(
            str(tmp_path / "colocated" / "critic_agent_1" / "weights.safetensors")
        ).items():
            got = load_file(str(ckpt / "critic_agent_1" / "weights.safetensors"))[name]
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)

        after_save = runtime.train("agent_1", _fixed_samples(5))
    finally:
        runtime.shutdown()
    resumed_runtime = RayRuntime(load_config(path, [*overrides, "ray.colocate_models=false"]))
    try:  # a fresh job resumes exactly: policy, optimizer and critic actors' states
        resumed_runtime.start()
        assert resumed_runtime.load(str(ckpt)) == {"step": 2}
        assert resumed_runtime.versions() == {"agent_1": 2, "agent_2": 0}
        resumed = resumed_runtime.train("agent_1", _fixed_samples(5))
        for key in ("policy_loss", "kl", "value_loss", "value_mean", "grad_norm"):
            assert resumed[key] == pytest.approx(after_save[key], rel=1e-6, abs=1e-8), key
    finally:
        resumed_runtime.shutdown()


@pytest.mark.parametrize("mode", ["lora", "per_agent"])
def test_rollout_actors_sample_with_the_learners_weights(mode, tmp_path):
    cfg = load_config(
        ROOT / "examples" / "tiny.yaml",
        [f"policy.mode={mode}", "rollout.max_new_tokens=4", "ray.num_rollout_workers=2"],
        ("policy.lora_r", "policy.lora_alpha") if mode != "lora" else (),  # tiny.yaml's LoRA keys
    )
    runtime = RayRuntime(cfg)
    assert [s.name for s in runtime.actors() if s.kind == "rollout"] == [
        "rollout_worker_0",
        "rollout_worker_1",
    ]
    chats = [[{"role": "user", "content": f"Say {w}"}] for w in ("hi", "yes", "no")]
    try:
        runtime.start()
        assert {"rollout_worker_0", "rollout_worker_1"} <= set(runtime.worker_pids)
        policy_actor = runtime._owner["agent_2"]

        def greedy_both():
            """The same greedy turns from the rollout actors (split 1 + 2) and from the policy actor itself."""
            return runtime.generate("agent_2", chats, greedy=True), runtime._get(
                policy_actor.generate.remote("agent_2", chats, True)
            )

        def same(a, b):
            assert [g.prompt_token_ids for g in a] == [g.prompt_token_ids for g in b]  # order kept
            assert [g.response_token_ids for g in a] == [g.response_token_ids for g in b]
            for x, y in zip(a, b, strict=True):
                assert torch.allclose(
                    torch.tensor(x.response_logprobs), torch.tensor(y.response_logprobs), atol=1e-4
                )

        before, own = greedy_both()
        same(before, own)  # synced at start: the rollout actors hold the policy's initial weights
        starts = ["Hi", "", "No, because"]  # a reply start per chat, split with the chats (1 + 2)
        started = runtime.generate("agent_2", chats, True, starts)
        same(started, runtime._get(policy_actor.generate.remote("agent_2", chats, True, starts)))
        assert [g.text[: len(s)] for g, s in zip(started, starts, strict=True)] == starts
        assert started[1].prompt_token_ids == before[1].prompt_token_ids != started[0].prompt_token_ids
        sampled = runtime.generate("agent_2", [chats[0]] * 4)  # two rows on each actor
        assert sampled[0].response_token_ids != sampled[2].response_token_ids  # actors seed apart

        samples = [
            one_turn(g.prompt_token_ids, g.response_token_ids, float(i % 2), 0) for i, g in enumerate(sampled)
        ]
        assert runtime.train("agent_2", samples)["policy_version"] == 1.0
        after, own = greedy_both()
        same(after, own)  # the update reached the rollout actors
        assert all(g.policy_version == 1 for g in after)
        moved = [
            abs(x - y)
            for a, b in zip(before, after, strict=True)
            for x, y in zip(a.response_logprobs, b.response_logprobs, strict=False)
        ]
        assert max(moved) > 1e-4

        runtime.save(str(tmp_path / "ckpt"), {"step": 1})
        assert runtime.load(str(tmp_path / "ckpt")) == {"step": 1}
        for actor in runtime._rollout:
            assert runtime._get(actor.versions.remote()) == {"agent_1": 0, "agent_2": 1}
        same(runtime.generate("agent_2", chats, greedy=True), after)
    finally:
        runtime.shutdown()


@pytest.fixture(scope="module")
def per_agent_runtime() -> Iterator[RayRuntime]:
    """One started ``per_agent`` runtime (a policy actor per agent), shared by the tests below: each asserts the
    version changes it makes from the versions it finds, so they pass in either order. They are the module's
    last tests, so in a serial run its idle actors reserve no CPUs while the module's other runtimes start."""
    cfg = load_config(
        ROOT / "examples" / "tiny.yaml",
        ["policy.mode=per_agent", "rollout.max_new_tokens=4"],
        ("policy.lora_r", "policy.lora_alpha"),  # tiny.yaml's LoRA keys: no adapters in per_agent mode
    )
    runtime = RayRuntime(cfg)
    try:
        runtime.start()
        yield runtime
    finally:
        runtime.shutdown()


def test_per_agent_actors_route_calls_and_checkpoint(per_agent_runtime, tmp_path):
    runtime = per_agent_runtime
    assert runtime.groups() == [["agent_1"], ["agent_2"]]
    assert set(runtime.worker_pids) == {"policy_worker_0", "policy_worker_1"}
    before = runtime.versions()
    chat = [[{"role": "user", "content": "Say hi"}]] * 2
    gens = runtime.generate("agent_2", chat)
    assert len(gens) == 2 and all(g.response_token_ids for g in gens)
    samples = [
        one_turn(g.prompt_token_ids, g.response_token_ids, float(i), 0, policy_version=before["agent_2"])
        for i, g in enumerate(gens)
    ]
    stats = runtime.train("agent_2", samples)
    trained = {**before, "agent_2": before["agent_2"] + 1}  # agent_2's actor only
    assert stats["policy_version"] == trained["agent_2"]
    assert runtime.versions() == trained
    runtime.save(str(tmp_path / "ckpt"), {"step": 1})
    assert {p.name for p in (tmp_path / "ckpt").iterdir()} == {"worker_0", "worker_1"}
    assert runtime.load(str(tmp_path / "ckpt")) == {"step": 1}
    assert runtime.versions() == trained


def test_the_policy_actor_takes_its_own_batch_from_the_store(per_agent_runtime, tmp_path):
    """Issue 30: the policy actor samples the agent's table itself and trains on what it kept; the driver gets
    episode ids and figures, and its own store client never samples. A store outage reaches the driver as the
    store's own UnavailableError (what the loop's reconnecting retries)."""
    from unittest import mock

    runtime = per_agent_runtime
    before = runtime.versions()
    with _store(tmp_path) as (store, access):
        samples = _fixed_samples(0, version=before["agent_1"])
        with mock.patch.object(
            ExperienceSharingClient, "sample_batch", side_effect=AssertionError("the driver sampled")
        ):
            got, summary, stats = _take_and_train(runtime, store, access, samples)
        assert got.item_ids == tuple(t.episode_id for t in samples)
        assert (summary.items, len(summary.trained), summary.lag_max) == (3, 3, 0)
        assert [r.tokens for r in summary.trained] == [len(t.turns[0].response_token_ids) for t in samples]
        trained = {**before, "agent_1": before["agent_1"] + 1}  # agent_1's actor only
        assert stats["policy_version"] == trained["agent_1"] and runtime.versions() == trained
        assert store.info("job/agent_1").size == 0  # taken once, by the actor
    with pytest.raises(UnavailableError):
        runtime.take_items("agent_1", "job/agent_1", 1, trained["agent_1"], access)
