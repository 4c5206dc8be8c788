"""Reference and critic as separate workers (ray.colocate_models=false) give the numbers of the colocated layout.

In-process (no Ray): a colocated PolicyWorker and a split one (PolicyWorker + ReferenceWorker + CriticWorker),
both on the tiny random model, train on the same samples; weights and statistics must agree.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from marti.config import load_config
from marti.errors import InvalidArgumentError
from marti.types.trajectory import Trajectory
from services.trainer.learn.experience import collate
from services.trainer.learn.learner import update_windows
from services.trainer.ray.model_workers import (
    CriticWorker,
    ReferenceWorker,
    critic_actor_config,
    reference_actor_config,
)
from services.trainer.ray.policy_worker import PolicyWorker, policy_actor_config
from services.trainer.ray.runtime import RayRuntime
from tests.trainer_data import one_turn

ROOT = Path(__file__).resolve().parents[4]
PPO = ["algorithm.advantage_estimator=gae", "algorithm.kl_coef=0.05", "micro_train_batch_size=1"]


#: tiny.yaml's LoRA keys, unset (to their defaults) where a test runs it outside policy.mode lora.
NOT_LORA = ("policy.lora_r", "policy.lora_alpha")


def _cfg(*overrides: str, unset: tuple[str, ...] = ()):
    return load_config(ROOT / "examples" / "tiny.yaml", [*PPO, *overrides], unset)


def _samples(n: int = 3, seed: int = 7) -> list[Trajectory]:
    """n samples of different prompt/response lengths (so padding is exercised), one group."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        prompt = torch.randint(10, 1000, (4 + i,), generator=g).tolist()
        response = torch.randint(10, 1000, (5 - i,), generator=g).tolist()
        out.append(one_turn(prompt, response, float(i % 2), 0))
    return out


def _weights(worker: PolicyWorker, agent: str) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in worker.policy.state_for_sync(agent).items()}


@pytest.mark.parametrize(
    ("mode", "agent", "extra"),
    [
        ("lora", "agent_1", ["algorithm.use_kl_loss=false", "gradient_accumulation_steps=2"]),
        ("per_agent", "agent_2", ["algorithm.use_kl_loss=true", "algorithm.ppo_epochs=2"]),
    ],
)
def test_split_reference_and_critic_match_the_colocated_update(mode, agent, extra):
    """Precomputed ref logprobs and old values through update_agent == the colocated in-process path."""
    overrides = [f"policy.mode={mode}", *extra]
    unset = NOT_LORA if mode != "lora" else ()
    colocated = PolicyWorker(policy_actor_config(_cfg(*overrides, unset=unset)), num_threads=1)
    split_cfg = _cfg(*overrides, "ray.colocate_models=false", unset=unset)
    policy = PolicyWorker(policy_actor_config(split_cfg), num_threads=1)
    reference = ReferenceWorker(reference_actor_config(split_cfg, agent), num_threads=1)
    critic = CriticWorker(critic_actor_config(split_cfg, agent), num_threads=1)
    assert not policy.critics and not policy.policy._refs, "the split policy keeps no reference or critic"
    assert _weights(colocated, agent).keys() == _weights(policy, agent).keys()
    initial = _weights(colocated, agent)
    initial_head = colocated.critics[agent].value_head.weight.detach().clone()
    for step in range(2):  # the KL is 0 until the policy has left its reference: compare a second step
        samples = _samples(seed=step)
        expected = colocated.train(agent, samples)

        ref_lp, old_values = reference.ref_logprobs(samples), critic.values(samples)
        batch = collate(samples, agent, 0)
        assert ref_lp.shape == old_values.shape == batch.action_mask.shape and ref_lp.dtype == torch.float32
        assert bool((ref_lp[batch.action_mask] < 0).all())
        stats, returns = policy.train(agent, samples, ref_lp, old_values, return_returns=True)
        assert returns.shape == batch.action_mask.shape
        stats.update(critic.fit(samples, old_values, returns))

        for key, value in expected.items():
            if key != "train_time_s":
                assert stats[key] == pytest.approx(value, rel=1e-5, abs=1e-7), (step, key)
    assert expected["kl"] != 0.0 and expected["value_loss"] > 0
    assert {"value_loss", "vf_clip_frac", "value_mean", "kl"} <= stats.keys()
    assert any(not torch.equal(initial[k], v) for k, v in _weights(colocated, agent).items())
    assert not torch.equal(initial_head, colocated.critics[agent].value_head.weight)
    for name, want in _weights(colocated, agent).items():
        torch.testing.assert_close(policy.policy.state_for_sync(agent)[name], want, rtol=1e-5, atol=1e-6)
    want_critic = colocated.critics[agent].state_dict()
    for name, got in critic.critic.state_dict().items():
        torch.testing.assert_close(got, want_critic[name], rtol=1e-5, atol=1e-6)


def test_critic_worker_checkpoint_resumes_exactly(tmp_path):
    cfg = _cfg("ray.colocate_models=false")
    critic = CriticWorker(critic_actor_config(cfg, "agent_1"), num_threads=1)
    samples = _samples()
    values = critic.values(samples)
    returns = torch.ones_like(values)
    critic.fit(samples, values, returns)
    critic.save(str(tmp_path / "critic"))
    first = critic.fit(samples, values, returns)
    critic.load(str(tmp_path / "critic"))
    assert critic.fit(samples, values, returns) == first
    with pytest.raises(InvalidArgumentError, match=r"returns must be \(B, A\)"):
        critic.fit(samples, values, returns[:, :-1])


def test_update_windows_cover_every_row_once_per_epoch():
    windows = update_windows(5, micro_batch_size=2, grad_accum_steps=2, ppo_epochs=2)
    assert [size for _, size in windows] == [4, 1, 4, 1]
    rows = [int(r) for chunks, _ in windows[:2] for c in chunks for r in c]
    assert rows == [0, 1, 2, 3, 4]
    assert [size for _, size in update_windows(3, 1, None)] == [3]


def test_separate_layout_adds_reference_and_critic_actors_that_fit_on_two_cpus():
    cfg = _cfg(
        "policy.mode=per_agent", "ray.colocate_models=false", "ray.num_cpus_per_worker=1", unset=NOT_LORA
    )
    runtime = RayRuntime(cfg)
    names = [a.name for a in runtime.actors()]
    assert names == [
        "policy_worker_0",
        "policy_worker_1",
        "reference_agent_1",
        "critic_agent_1",
        "reference_agent_2",
        "critic_agent_2",
    ]
    bundles = runtime._bundles(runtime.actors(), {"CPU": 2.0})
    assert len(bundles) == 6 and sum(b["CPU"] for b in bundles) <= 2.0
    assert all(b["CPU"] > 0 and "GPU" not in b for b in bundles)
    colocated = RayRuntime(_cfg("policy.mode=per_agent", unset=NOT_LORA))
    assert [a.kind for a in colocated.actors()] == ["policy", "policy"]
    assert colocated._bundles(colocated.actors(), {"CPU": 2.0}) == [{"CPU": 1.0}, {"CPU": 1.0}]
    grpo = RayRuntime(_cfg("ray.colocate_models=false", "algorithm.advantage_estimator=grpo"))
    assert [a.name for a in grpo.actors()] == ["policy_worker", "reference_agent_1", "reference_agent_2"]


def test_an_actor_takes_the_drivers_validated_config_and_never_parses_a_mapping():
    """The config is validated once, on the driver: an actor keeps the very object it was given (Ray ships the
    frozen TrainConfig by value), and a raw mapping is refused by type instead of being parsed again."""
    from services.trainer.ray.actor_setup import actor_setup

    cfg = _cfg()
    assert actor_setup(cfg)[0] is cfg
    with pytest.raises(
        InvalidArgumentError,
        match="config must be a validated marti.config.TrainConfig or an ActorConfig, got dict",
    ):
        actor_setup(cfg.model_dump(mode="json"))


def test_the_reference_actor_gets_a_narrow_frozen_config_of_its_part():
    """Built on the driver: the reference model's layout, seed, device and offloading, no config section."""
    import dataclasses

    from pydantic import BaseModel

    from marti.config import TrainConfig

    cfg = _cfg("ray.colocate_models=false", "strategy.offload_reference_model=true")
    narrow = reference_actor_config(cfg, "agent_1")
    assert not any(
        isinstance(getattr(narrow, f.name), BaseModel | TrainConfig) for f in dataclasses.fields(narrow)
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        narrow.offload = False  # type: ignore[misc]
    (spec,) = narrow.layout.agents
    assert (narrow.offload, spec.name, spec.is_tuning, narrow.seed) == (True, "agent_1", False, cfg.seed)
    assert ReferenceWorker(narrow, num_threads=1).cfg is narrow


def test_the_critic_actor_gets_a_narrow_frozen_config_of_its_part():
    """Built on the driver: the critic's model, seed and engine settings and the update's settings."""
    import dataclasses

    from pydantic import BaseModel

    cfg = _cfg("ray.colocate_models=false", "algorithm.critic_learning_rate=0.003", "seed=7")
    narrow = critic_actor_config(cfg, "agent_1")
    assert not any(isinstance(getattr(narrow, f.name), BaseModel) for f in dataclasses.fields(narrow))
    with pytest.raises(dataclasses.FrozenInstanceError):
        narrow.agent = "agent_2"  # type: ignore[misc]
    assert (narrow.critic.optim.lr, narrow.critic.seed, narrow.critic.strategy) == (0.003, 107, "torch")
    assert narrow.learner.micro_batch_size == cfg.micro_train_batch_size
    assert CriticWorker(narrow, num_threads=1).cfg is narrow
    with pytest.raises(InvalidArgumentError, match="does not train"):
        critic_actor_config(_cfg("agents.0.is_tuning=false"), "agent_1")


def test_a_policy_actor_gets_only_its_frozen_part_of_the_config():
    """Like the reference and critic actors, a policy actor gets a narrow frozen config built on the driver (its
    agents, layout, sampling, learner, optimizer and critic settings); a whole training config is refused by
    name, not read in the actor."""
    import dataclasses

    cfg = _cfg(
        "policy.mode=per_agent",
        "learning_rate=3e-4",
        "policy.ema=true",
        "policy.ema_beta=0.9",
        unset=NOT_LORA,
    )
    narrow = policy_actor_config(cfg, ["agent_2"])
    assert narrow.agents == ("agent_2",) and [a.name for a in narrow.layout.agents] == ["agent_2"]
    assert set(narrow.optim) == {"agent_2"} and narrow.optim["agent_2"].lr == pytest.approx(3e-4)
    assert set(narrow.critics) == {"agent_2"} and narrow.learner.micro_batch_size == 1
    assert (narrow.ema_beta, narrow.engine, narrow.engine_owns_weights, narrow.resident_versions) == (
        0.9, None, False, 1,
    )  # fmt: skip
    split = policy_actor_config(_cfg("ray.colocate_models=false", "ray.num_rollout_workers=1"))
    assert split.critics == {} and split.engine == "hf" and split.ema_beta is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        narrow.ema_beta = 0.5  # type: ignore[misc]
    with pytest.raises(InvalidArgumentError, match="PolicyActorConfig"):
        PolicyWorker(cfg, num_threads=1)


def test_a_bf16_rollout_engine_owns_its_copy_and_is_synced_after_each_update():
    """``rollout.dtype=bfloat16`` on a colocated actor: the engine samples with a bf16 copy (so the actor treats
    it as owning its weights: EMA evaluations go through ``pinned``, not the live modules), and every update
    refreshes that copy with the trained float32 weights."""
    worker = PolicyWorker(
        policy_actor_config(_cfg("policy.mode=per_agent", "rollout.dtype=bfloat16", unset=NOT_LORA)),
        num_threads=1,
    )
    assert not worker.cfg.engine_owns_weights and worker.engine_owns_weights
    agent = "agent_1"
    copy = worker.engine._agents[agent].model
    assert copy is not worker.policy.rollout_target(agent)[0]
    worker.train(agent, _samples())
    trained = worker.policy.state_for_sync(agent)
    synced = copy.state_dict()
    assert all(synced[k].dtype == torch.bfloat16 for k in trained if trained[k].is_floating_point())
    assert all(torch.equal(synced[k], v.to(torch.bfloat16)) for k, v in trained.items())
    assert worker.engine.policy_version(agent) == worker.policy.version(agent) == 1
