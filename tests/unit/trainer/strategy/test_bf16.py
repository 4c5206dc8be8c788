"""bf16 training on CPU: the torch strategy (bf16 autocast over fp32 weights) and DeepSpeed (bf16 weights with fp32
master copies, ZeRO 0-3) each run their forward in bf16, lower the loss on a fixed batch and resume from a
checkpoint; ``strategy.bf16`` in the config reaches the learner's forward. A tiny random Llama, seconds per test
(the DeepSpeed ones are marked slow: the first use of DeepSpeed JIT-builds a communication op)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from services.trainer.models.loading import TinyModelConfig, build_tiny_model, load_tokenizer
from services.trainer.strategy import OptimConfig, TorchStrategy

ROOT = Path(__file__).resolve().parents[4]
SMALL = TinyModelConfig(
    num_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2
)
IDS = torch.randint(0, 1000, (2, 12), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-llama")


def _model(tok, seed: int = 0) -> torch.nn.Module:
    return build_tiny_model(tok, seed=seed, config=SMALL).train()


@contextlib.contextmanager
def _linear_output_dtypes(model: torch.nn.Module) -> Iterator[set[torch.dtype]]:
    """Collect the dtype of every ``nn.Linear`` output computed inside the block (the matmuls' precision)."""
    seen: set[torch.dtype] = set()
    handles = [
        m.register_forward_hook(lambda _m, _i, out: seen.add(out.dtype))
        for m in model.modules()
        if isinstance(m, torch.nn.Linear)
    ]
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


def _fit(engine, model, steps: int) -> list[float]:
    """``steps`` optimizer steps on the fixed batch ``IDS`` (forward under ``engine.autocast()``); the losses."""
    losses = []
    for _ in range(steps):
        with engine.autocast():
            loss = model(input_ids=IDS, labels=IDS).loss
        losses.append(float(loss.detach()))
        engine.backward(loss)
        assert engine.step().stepped
    return losses


def _params(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


# ------------------------------------------------------------------------------------------- torch strategy


@pytest.mark.parametrize("bf16", [True, False])
def test_torch_strategy_forward_precision_follows_the_flag(tok, bf16):
    model = _model(tok)
    engine = TorchStrategy().setup(model, model.parameters(), OptimConfig(bf16=bf16, total_steps=2))
    assert engine.bf16 is bf16
    with _linear_output_dtypes(model) as dtypes, engine.autocast():
        model(input_ids=IDS, labels=IDS)
    assert dtypes == ({torch.bfloat16} if bf16 else {torch.float32})


def test_torch_bf16_lowers_the_loss_with_fp32_weights_and_gradients(tok):
    model = _model(tok)
    engine = TorchStrategy().setup(model, model.parameters(), OptimConfig(lr=1e-2, total_steps=8, bf16=True))
    with _linear_output_dtypes(model) as dtypes:
        losses = _fit(engine, model, 6)
    assert dtypes == {torch.bfloat16}
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0] - 0.5, losses
    assert all(a > b for a, b in zip(losses, losses[1:], strict=False)), losses
    # Mixed precision, not bf16 weights: the optimizer updates fp32 parameters from fp32 gradients.
    with engine.autocast():
        loss = model(input_ids=IDS, labels=IDS).loss
    engine.backward(loss)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert {p.grad.dtype for p in model.parameters() if p.grad is not None} == {torch.float32}


def test_torch_bf16_checkpoint_resumes_exactly(tok, tmp_path):
    cfg = OptimConfig(lr=1e-2, total_steps=8, warmup_steps=1, weight_decay=0.01, bf16=True)
    straight = _model(tok)
    e1 = TorchStrategy().setup(straight, straight.parameters(), cfg)
    _fit(e1, straight, 3)
    e1.save_checkpoint(tmp_path / "ckpt", {"offset": 3})
    tail = _fit(e1, straight, 2)

    resumed = _model(tok, seed=7)  # other weights, replaced by the checkpoint's
    e2 = TorchStrategy().setup(resumed, resumed.parameters(), cfg)
    assert e2.load_checkpoint(tmp_path / "ckpt") == {"offset": 3}
    assert e2.bf16 and e2.global_step == 3
    assert _fit(e2, resumed, 2) == tail
    a, b = _params(straight), _params(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("bf16", [True, False])
def test_config_strategy_bf16_reaches_the_learner_forward_and_checkpoints(tmp_path, bf16):
    """``strategy.bf16`` of a job config: the policy worker's update runs its forward in bf16 (or not at all),
    and its checkpoint restores the trained LoRA weights into a fresh worker."""
    from marti.config import load_config
    from services.trainer.ray.policy_worker import PolicyWorker, policy_actor_config
    from tests.trainer_data import one_turn

    overrides = [f"strategy.bf16={str(bf16).lower()}", "micro_train_batch_size=2"]
    cfg = load_config(ROOT / "examples" / "tiny.yaml", overrides)
    worker = PolicyWorker(policy_actor_config(cfg))
    assert worker.strategies["agent_1"].bf16 is bf16
    prompt = [5, 6, 7, 8, 9]
    samples = [one_turn(prompt, [10 + i, 11 + i, 12], float(i % 2), 0) for i in range(4)]
    with _linear_output_dtypes(worker.policy.model("agent_1")) as dtypes:
        stats = worker.train("agent_1", samples)
    assert math.isfinite(stats["policy_loss"]) and math.isfinite(stats["grad_norm"]), stats
    assert (torch.bfloat16 in dtypes) is bf16, dtypes
    trained = {n: p.detach().clone() for n, p in worker.policy.named_parameters("agent_1")}
    assert all(p.dtype == torch.float32 for p in trained.values())
    worker.save(str(tmp_path / "ckpt"), {"step": 1})

    fresh = PolicyWorker(policy_actor_config(cfg))
    assert fresh.load(str(tmp_path / "ckpt")) == {"step": 1}
    restored = dict(fresh.policy.named_parameters("agent_1"))
    assert all(torch.equal(trained[n], restored[n]) for n in trained)


# ------------------------------------------------------------------------------------------------- DeepSpeed


def _deepspeed(tok, stage: int, seed: int = 0, **optim):
    from services.trainer.strategy.deepspeed_strategy import DeepSpeedStrategy

    model = _model(tok, seed)
    cfg = OptimConfig(**{"lr": 1e-2, "total_steps": 10, "bf16": True, **optim})
    return DeepSpeedStrategy(zero_stage=stage).setup(model, list(model.parameters()), cfg)


@pytest.mark.slow
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_deepspeed_bf16_trains_in_bf16_and_resumes(tok, tmp_path, stage):
    """bf16 weights (the forward in bf16), a falling loss, and a checkpoint that restores the fp32 master
    weights as well: a resumed engine's next steps equal the original's."""
    eng = _deepspeed(tok, stage)
    assert eng.bf16
    assert {p.dtype for p in eng.model.parameters()} == {torch.bfloat16}
    # The optimizer steps fp32 copies (ZeRO-3 keeps them in its own flat partitions).
    masters = getattr(eng.ds.optimizer, "fp32_partitioned_groups_flat", None) or [
        p for group in eng.ds.basic_optimizer.param_groups for p in group["params"]
    ]
    assert masters and {p.dtype for p in masters} == {torch.float32}
    with _linear_output_dtypes(eng.model) as dtypes:
        losses = _fit(eng, eng.model, 5)
    assert dtypes == {torch.bfloat16}
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0] - 0.5, (stage, losses)
    eng.save_checkpoint(tmp_path / f"z{stage}", {"offset": 5})
    tail = _fit(eng, eng.model, 2)
    with eng.gathered():
        after = _params(eng.model)

    other = _deepspeed(tok, stage, seed=5)
    assert other.load_checkpoint(tmp_path / f"z{stage}") == {"offset": 5} and other.global_step == 5
    assert _fit(other, other.model, 2) == tail
    with other.gathered():
        assert all(torch.equal(after[n], p) for n, p in other.model.named_parameters()), stage


@pytest.mark.slow
def test_deepspeed_bf16_stage0_takes_the_same_first_update_as_zero1(tok):
    """At ZeRO stage 0 DeepSpeed's bf16 optimizer wrapper steps the optimizer once with zero gradients while it
    is set up; the strategy keeps that step from moving the fp32 master weights (weight decay) or counting as
    Adam's first, so stage 0 and stage 1 update alike."""
    engines = {stage: _deepspeed(tok, stage, lr=5e-2, weight_decay=0.2) for stage in (0, 1)}
    assert not engines[0].ds.basic_optimizer.state and not engines[1].ds.basic_optimizer.state
    masters = engines[0].ds.basic_optimizer.param_groups[0]["params"]  # stage 0: one fp32 copy per parameter
    initial = [p.detach().to(torch.bfloat16).float() for p in _model(tok).parameters()]
    assert len(masters) == len(initial)
    assert all(m.dtype == torch.float32 and torch.equal(m, i) for m, i in zip(masters, initial, strict=True))
    losses = {stage: _fit(eng, eng.model, 3) for stage, eng in engines.items()}
    assert losses[0] == pytest.approx(losses[1], abs=2e-3), losses
    assert {float(s["step"]) for s in engines[0].ds.basic_optimizer.state.values()} == {3.0}
    w0, w1 = _params(engines[0].model), _params(engines[1].model)
    assert max(float((w0[n].float() - w1[n].float()).abs().max()) for n in w0) < 1e-2
