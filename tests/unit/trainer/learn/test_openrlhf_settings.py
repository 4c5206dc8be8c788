"""The OpenRLHF-style settings that act when models are loaded or metrics written.

``policy.disable_dropout`` (dropout zeroed at load), ``output.log_every`` (metrics thinned, last step kept),
``strategy.critic_zero_stage`` (the critics' ZeRO stage), ``strategy.offload_reference_model`` (reference moved to
the device only for its forward), ``strategy.init_on_gpu`` (construction device) and ``agents.N.ref_model`` (the
reference loaded from another model). Each test fails when its setting is ignored.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from marti.config import load_config
from services.trainer.models.loading import (
    build_tiny_model,
    construction_device,
    load_model,
    load_tokenizer,
    offloaded,
    zero_dropout,
)
from services.trainer.models.policy import AgentSpec, MultiAgentPolicy, PolicyLayout
from services.trainer.observe.metrics import METRICS_FILE, RunWriter
from services.trainer.ray.policy_worker import (
    build_agent_critic,
    critic_settings,
    critic_zero_stage,
    policy_layout,
    train_strategy,
)
from tests.trainer_data import one_turn

ROOT = Path(__file__).resolve().parents[4]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-llama")


def _batch():
    """Two left-padded sequences (B=2, T=8) whose last A=3 tokens are the response."""
    ids = torch.tensor([[0, 0, 5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16, 17, 18]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1], [1] * 8])
    return ids, mask, torch.ones(2, 3)


#: tiny.yaml's LoRA keys, unset (to their defaults) where a test runs it outside policy.mode lora.
NOT_LORA = ("policy.lora_r", "policy.lora_alpha")


def _cfg(*overrides: str, unset: tuple[str, ...] = ()):
    return load_config(ROOT / "examples" / "tiny.yaml", list(overrides), unset)


# ----------------------------------------------------------------------------------------- policy.disable_dropout
def _llama_with_dropout(tok, seed: int):
    """A tiny Llama whose config has attention dropout 0.5 (eager attention applies it in train mode)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attention_dropout=0.5,
        attn_implementation="eager",
        pad_token_id=tok.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(cfg)


@pytest.mark.parametrize("disable", [True, False])
def test_disable_dropout_makes_train_mode_forwards_deterministic(tok, disable):
    spec = AgentSpec("a", "tiny-llama")
    policy = MultiAgentPolicy(
        PolicyLayout(mode="per_agent", agents=(spec,), disable_dropout=disable),
        model_loader=lambda name, t, seed: _llama_with_dropout(t, seed),
    )
    policy.train(True)
    ids, mask, action = _batch()
    with torch.no_grad():
        first, second = (policy.logprobs("a", ids, mask, action) for _ in range(2))
    assert torch.equal(first, second) is disable
    model = policy.model("a")
    assert (model.config.attention_dropout == 0.0) is disable
    ref = policy._refs["a"]  # the frozen copy is made after the dropout is zeroed
    assert all(
        (m.attention_dropout == 0.0) is disable for m in ref.modules() if hasattr(m, "attention_dropout")
    )


def test_zero_dropout_covers_dropout_modules_module_attributes_and_config():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=16, n_layer=1, n_head=2, n_positions=16)).train()
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert not torch.equal(model(ids).logits, model(ids).logits)  # GPT-2's nn.Dropout modules at 0.1
    assert zero_dropout(model) > 0
    assert all(m.p == 0.0 for m in model.modules() if isinstance(m, torch.nn.Dropout))
    assert (
        model.config.resid_pdrop == 0.0 and model.config.attn_pdrop == 0.0 and model.config.embd_pdrop == 0.0
    )
    with torch.no_grad():
        assert torch.equal(model(ids).logits, model(ids).logits)
    assert zero_dropout(model) == 0


def test_disable_dropout_reaches_the_policy_layout_and_the_critic():
    assert policy_layout(_cfg("policy.disable_dropout=true")).disable_dropout
    assert not policy_layout(_cfg()).disable_dropout


# ----------------------------------------------------------------------------------------------- output.log_every
def _steps(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / METRICS_FILE).read_text().splitlines()]


def test_log_every_writes_every_nth_step_and_the_final_one(tmp_path):
    with RunWriter(tmp_path / "a", use_tensorboard=False, log_every=3) as w:
        written = [w.log(s, {"team/reward": float(s)}, final=s == 7) for s in range(1, 8)]
    assert written == [False, False, True, False, False, True, True]
    assert _steps(tmp_path / "a") == [3, 6, 7]
    # a run stopped between two multiples: close() writes the last step it kept back
    with RunWriter(tmp_path / "b", use_tensorboard=False, log_every=3) as w:
        for s in range(1, 5):
            w.log(s, {"team/reward": float(s)})
    assert _steps(tmp_path / "b") == [3, 4]
    with RunWriter(tmp_path / "c", use_tensorboard=False) as w:  # default: every step
        for s in range(1, 4):
            assert w.log(s, {"team/reward": 0.0})
    assert _steps(tmp_path / "c") == [1, 2, 3]


def test_log_every_comes_from_the_config(tmp_path):
    cfg = _cfg("output.log_every=4", f"output.dir={tmp_path}")
    with RunWriter.from_config(cfg) as w:
        assert w.log_every == 4
        assert [w.log(s, {"team/reward": 1.0}) for s in (1, 4)] == [False, True]


# ---------------------------------------------------------------------------------------- strategy.critic_zero_stage
def test_critic_zero_stage_reaches_the_critics_deepspeed_config():
    from services.trainer.strategy.base import OptimConfig

    ds = ["strategy.name=deepspeed", "strategy.zero_stage=1"]
    own = _cfg(*ds, "strategy.critic_zero_stage=3", "algorithm.advantage_estimator=gae")
    same = _cfg(*ds)
    assert critic_zero_stage(own) == 3 and critic_zero_stage(same) == 1
    stage = train_strategy(own, critic_zero_stage(own)).ds_config(OptimConfig(), False)["zero_optimization"]
    assert stage["stage"] == 3
    assert train_strategy(own).ds_config(OptimConfig(), False)["zero_optimization"]["stage"] == 1  # policies


def test_critic_engine_trains_under_critic_zero_stage():
    cfg = _cfg(
        "strategy.name=deepspeed",
        "strategy.zero_stage=0",
        "strategy.critic_zero_stage=2",
        "algorithm.advantage_estimator=gae",
    )
    critic, engine = build_agent_critic(critic_settings(cfg, "agent_1", ["agent_1", "agent_2"]), "cpu")
    assert engine.zero_stage == 2
    assert engine.ds.zero_optimization_stage() == 2


# ----------------------------------------------------------------------------------- strategy.offload_reference_model
def _record_moves(module: torch.nn.Module, events: list) -> None:
    """Record ``module.to(...)`` calls and forwards into ``events`` (the calls still move the module)."""
    original = module.to

    def to(*args, **kwargs):
        events.append(("to", args[0] if args else kwargs.get("device")))
        return original(*args, **kwargs)

    module.to = to  # type: ignore[method-assign]
    module.register_forward_pre_hook(lambda *_: events.append("forward"))


@pytest.mark.parametrize("offload", [True, False])
def test_offloaded_reference_moves_to_the_device_only_for_its_forward(offload):
    policy = MultiAgentPolicy(
        PolicyLayout(mode="per_agent", agents=(AgentSpec("a", "tiny-llama"),), offload_reference=offload),
        device="cpu",
    )
    ref = policy._refs["a"]
    events: list = []
    _record_moves(ref, events)
    ids, mask, action = _batch()
    lp = policy.ref_logprobs("a", ids, mask, action)
    if offload:
        assert events == [("to", policy.device), "forward", ("to", policy.offload_device)]
    else:
        assert events == ["forward"]
    assert lp.shape == (2, 3)
    assert all(p.device == torch.device("cpu") for p in ref.parameters())


def test_offloaded_helper_calls_compute_then_offload_even_on_error():
    module = torch.nn.Linear(2, 2)
    calls: list = []
    module.to = lambda device: calls.append(device) or module  # type: ignore[method-assign]
    compute, offload = object(), object()
    with offloaded(module, compute, offload) as m:
        assert m is module and calls == [compute]
    assert calls == [compute, offload]
    with pytest.raises(RuntimeError), offloaded(module, compute, offload):
        raise RuntimeError("forward failed")
    assert calls == [compute, offload, compute, offload]


def test_offload_reference_reaches_the_policy_layout_and_the_reference_actor():
    from services.trainer.ray.model_workers import ReferenceWorker, reference_actor_config

    cfg = _cfg(
        "strategy.offload_reference_model=true",
        "algorithm.kl_coef=0.05",
        "policy.mode=per_agent",
        unset=NOT_LORA,
    )
    assert policy_layout(cfg).offload_reference
    worker = ReferenceWorker(reference_actor_config(cfg, "agent_1"), num_threads=1)
    module = worker.model.model("agent_1")
    events: list = []
    _record_moves(module, events)
    samples = [one_turn([5, 6, 7], [8, 9], 1.0, 0), one_turn([5, 6], [8, 9, 10], 0.0, 0)]
    assert worker.ref_logprobs(samples).shape == (2, 3)
    assert events == [("to", worker.device), "forward", ("to", "cpu")]


# ------------------------------------------------------------------------------------------------ strategy.init_on_gpu
def test_construction_device_follows_init_on_gpu():
    assert construction_device(True, "cuda") == torch.device("cuda")
    assert construction_device(True, "cuda:1") == torch.device("cuda:1")
    assert construction_device(False, "cuda") == torch.device("cpu")
    assert construction_device(True, "cpu") == torch.device("cpu")
    assert construction_device(False, "cpu") == torch.device("cpu")


def test_tiny_model_is_created_under_the_chosen_device(tok):
    meta = load_model("tiny-llama", tokenizer=tok, device="meta")  # created there, no weights materialised
    assert all(p.device.type == "meta" for p in meta.parameters())
    cpu = load_model("tiny-llama", tokenizer=tok, device=construction_device(True, "cpu"))
    assert all(p.device.type == "cpu" for p in cpu.parameters())
    same = build_tiny_model(tok, seed=0)
    assert all(
        torch.equal(a, b) for a, b in zip(cpu.state_dict().values(), same.state_dict().values(), strict=True)
    )


@pytest.mark.parametrize("init_on_gpu", [True, False])
def test_policy_loader_builds_on_the_construction_device(monkeypatch, tok, init_on_gpu):
    """``meta`` stands for an accelerator: with the switch the loader is asked to create the weights on the
    compute device, without it on the CPU."""
    import services.trainer.models.policy as policy_mod

    asked: list = []

    def fake_load(name, *, tokenizer, seed, attn_implementation, device):
        asked.append(torch.device(device))
        return build_tiny_model(tokenizer, seed=seed, device=device)

    monkeypatch.setattr(policy_mod, "load_model", fake_load)
    spec = AgentSpec("a", "tiny-llama")
    layout = PolicyLayout(mode="per_agent", agents=(spec,), keep_reference=False, init_on_gpu=init_on_gpu)
    MultiAgentPolicy(layout, device="meta")
    assert asked == [torch.device("meta") if init_on_gpu else torch.device("cpu")]
    assert policy_layout(_cfg(f"strategy.init_on_gpu={str(init_on_gpu).lower()}")).init_on_gpu is init_on_gpu


# ------------------------------------------------------------------------------------------------ agents.N.ref_model
@pytest.fixture(scope="module")
def other_model(tok, tmp_path_factory) -> Path:
    """A local Hugging Face folder holding a tiny model with other weights (seed 123), same tokenizer."""
    path = tmp_path_factory.mktemp("ref_model")
    build_tiny_model(tok, seed=123).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.mark.parametrize("mode", ["per_agent", "shared", "lora"])
def test_ref_model_is_the_reference_policy(tok, other_model, mode):
    ids, mask, action = _batch()

    def policy(ref_model):
        agents = (AgentSpec("a", "tiny-llama", ref_model=ref_model), AgentSpec("b", "tiny-llama"))
        return MultiAgentPolicy(PolicyLayout(mode=mode, agents=agents))

    default, other = policy(None), policy(str(other_model))
    lp_default, lp_other = (p.ref_logprobs("a", ids, mask, action) for p in (default, other))
    assert not torch.allclose(lp_default, lp_other)
    # the reference is exactly the saved model; the other agent keeps its default reference
    direct = MultiAgentPolicy(
        PolicyLayout(mode="per_agent", agents=(AgentSpec("x", str(other_model), is_tuning=False),))
    )
    assert torch.allclose(lp_other, direct.ref_logprobs("x", ids, mask, action), atol=1e-6)
    assert torch.allclose(
        default.ref_logprobs("b", ids, mask, action), other.ref_logprobs("b", ids, mask, action)
    )
    # the policy itself starts from pretrain_model either way
    assert torch.allclose(default.logprobs("a", ids, mask, action), other.logprobs("a", ids, mask, action))


def test_ref_model_reaches_the_policy_layout_and_the_reference_actor(other_model):
    from services.trainer.ray.model_workers import ReferenceWorker, reference_actor_config

    cfg = _cfg("algorithm.kl_coef=0.05", f"agents.0.ref_model={other_model}")
    assert [a.ref_model for a in policy_layout(cfg).agents] == [str(other_model), None]
    samples = [one_turn([5, 6, 7], [8, 9], 1.0, 0), one_turn([5, 6], [8, 9, 10], 0.0, 0)]
    with_ref = ReferenceWorker(reference_actor_config(cfg, "agent_1"), num_threads=1).ref_logprobs(samples)
    base = ReferenceWorker(reference_actor_config(_cfg("algorithm.kl_coef=0.05"), "agent_1"), num_threads=1)
    assert not torch.allclose(with_ref, base.ref_logprobs(samples))
