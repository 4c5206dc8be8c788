"""Training strategies: schedule values, accumulation, clipping, bf16, exact resume, DeepSpeed ZeRO 0-3."""

from __future__ import annotations

import math

import pytest
import torch

from marti.errors import InvalidArgumentError, NotFoundError
from services.trainer.job.run.checkpoint import CheckpointManager
from services.trainer.models.loading import TinyModelConfig, build_tiny_model, load_tokenizer
from services.trainer.strategy import OptimConfig, TorchStrategy, lr_multiplier, make_strategy

SMALL = TinyModelConfig(
    num_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2
)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-llama")


def _model(tok, seed=0):
    return build_tiny_model(tok, seed=seed, config=SMALL).train()


def _loss(model, ids):
    return model(input_ids=ids, labels=ids).loss


def _params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_cosine_schedule_hand_values():
    cfg = OptimConfig(total_steps=10, warmup_steps=2)
    expected = {0: 0.0, 1: 0.5, 2: 1.0, 6: 0.5, 10: 0.0, 12: 0.0}
    for step, value in expected.items():
        assert lr_multiplier(step, cfg) == pytest.approx(value, abs=1e-12), step
    assert lr_multiplier(4, cfg) == pytest.approx(0.5 * (1 + math.cos(math.pi * 2 / 8)))
    floor = OptimConfig(total_steps=10, warmup_steps=0, min_lr_ratio=0.1)
    assert lr_multiplier(10, floor) == pytest.approx(0.1) and lr_multiplier(0, floor) == pytest.approx(1.0)
    const = OptimConfig(total_steps=10, warmup_ratio=0.5, lr_scheduler="constant")
    assert [lr_multiplier(s, const) for s in (0, 1, 5, 9)] == [0.0, 0.2, 1.0, 1.0]


def test_linear_schedule_hand_values():
    cfg = OptimConfig(total_steps=10, warmup_steps=2, lr_scheduler="linear")
    expected = {0: 0.0, 1: 0.5, 2: 1.0, 4: 0.75, 6: 0.5, 10: 0.0, 12: 0.0}
    for step, value in expected.items():
        assert lr_multiplier(step, cfg) == pytest.approx(value, abs=1e-12), step
    floor = OptimConfig(total_steps=10, warmup_steps=0, lr_scheduler="linear", min_lr_ratio=0.1)
    assert lr_multiplier(5, floor) == pytest.approx(0.55) and lr_multiplier(10, floor) == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("name", "schedule", "floor"),
    [
        ("cosine", "cosine", 0.0),
        ("cosine_with_min_lr", "cosine", 0.1),
        ("linear", "linear", 0.0),
        ("constant", "constant", 0.0),
        ("constant_with_warmup", "constant", 0.0),
    ],
)
def test_each_config_schedule_builds_its_optimizer_schedule(name, schedule, floor):
    from marti.config import config_from_dict
    from services.trainer.ray.policy_worker import build_strategy

    cfg = config_from_dict(
        {
            "training_name": "t",
            "agents": [{"name": "a", "pretrain_model": "m", "role": "r"}],
            "lr_scheduler": name,
        }
    )
    lin = torch.nn.Linear(1, 1)
    optim = build_strategy(cfg, "a", lin, list(lin.parameters())).cfg
    assert (optim.lr_scheduler, optim.min_lr_ratio) == (schedule, floor)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"lr": 0.0},
        {"grad_accum_steps": 0},
        {"total_steps": 0},
        {"warmup_steps": 11, "total_steps": 10},
        {"warmup_ratio": 1.01},
        {"max_grad_norm": 0.0},
        {"min_lr_ratio": -0.1},
        {"betas": (0.9, 1.0)},
        {"lr_scheduler": "exponential"},
    ],
)
def test_optim_config_rejects_out_of_range_values(kwargs):
    with pytest.raises(InvalidArgumentError) as err:
        OptimConfig(**kwargs)
    assert next(iter(kwargs)) in str(err.value)


def test_optim_config_edges_are_accepted():
    OptimConfig(
        grad_accum_steps=1,
        total_steps=1,
        warmup_steps=1,
        warmup_ratio=1.0,
        max_grad_norm=None,
        min_lr_ratio=1.0,
    )


def test_accumulation_equals_one_big_batch(tok):
    ids = torch.randint(0, 1000, (4, 12), generator=torch.Generator().manual_seed(0))
    big, acc = _model(tok), _model(tok)
    cfg = dict(lr=1e-2, total_steps=5, max_grad_norm=None)
    e_big = TorchStrategy().setup(big, big.parameters(), OptimConfig(grad_accum_steps=1, **cfg))
    e_acc = TorchStrategy().setup(acc, acc.parameters(), OptimConfig(grad_accum_steps=2, **cfg))
    e_big.backward(_loss(big, ids))
    assert e_big.step().stepped
    e_acc.backward(_loss(acc, ids[:2]))
    first = e_acc.step()
    assert not first.stepped and e_acc.global_step == 0
    e_acc.backward(_loss(acc, ids[2:]))
    assert e_acc.step().stepped and e_acc.global_step == 1
    pb, pa = _params(big), _params(acc)
    assert all(torch.allclose(pb[k], pa[k], atol=1e-6) for k in pb)


def test_clipping_reports_the_pre_clip_norm_and_bounds_the_update(tok):
    model = _model(tok)
    ids = torch.randint(0, 1000, (2, 8), generator=torch.Generator().manual_seed(1))
    eng = TorchStrategy().setup(
        model, model.parameters(), OptimConfig(lr=1.0, max_grad_norm=1e-3, total_steps=2)
    )
    eng.backward(_loss(model, ids))
    manual = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
    result = eng.step()
    assert result.grad_norm == pytest.approx(float(manual), rel=1e-5) and result.grad_norm > 1e-3
    assert result.lr == pytest.approx(1.0)


def test_non_finite_gradients_skip_the_update(tok):
    model = _model(tok)
    before = _params(model)
    eng = TorchStrategy().setup(model, model.parameters(), OptimConfig(lr=1e-2, total_steps=2))
    eng.backward(_loss(model, torch.tensor([[5, 6, 7]])) * float("nan"))
    result = eng.step()
    assert result.skipped_nonfinite and not result.stepped and eng.global_step == 0
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
    with pytest.raises(InvalidArgumentError):
        eng.backward(torch.ones(2))


def test_bf16_autocast_on_cpu(tok):
    model = _model(tok)
    eng = TorchStrategy().setup(model, model.parameters(), OptimConfig(bf16=True, total_steps=2))
    with eng.autocast():
        logits = model(input_ids=torch.tensor([[5, 6, 7]])).logits
    assert logits.dtype == torch.bfloat16
    assert (
        TorchStrategy().setup(model, model.parameters(), OptimConfig(total_steps=2)).bf16 is False
    )  # auto: CPU


def _train(engine, model, steps, position):
    """Draw each micro batch from the global RNG (so RNG restore matters) and train ``steps`` micro steps."""
    for _ in range(steps):
        ids = torch.randint(0, 1000, (2, 10))
        engine.backward(_loss(model, ids))
        engine.step()
        position["offset"] += 2


def test_exact_resume_is_bit_identical(tok, tmp_path):
    cfg = OptimConfig(lr=5e-3, grad_accum_steps=2, total_steps=6, warmup_steps=2, weight_decay=0.01)
    torch.manual_seed(7)
    straight = _model(tok)
    e1 = TorchStrategy().setup(straight, straight.parameters(), cfg)
    pos1 = {"epoch": 0, "offset": 0}
    _train(e1, straight, 12, pos1)

    torch.manual_seed(7)
    first = _model(tok)
    e2 = TorchStrategy().setup(first, first.parameters(), cfg)
    pos2 = {"epoch": 0, "offset": 0}
    _train(e2, first, 5, pos2)  # stop mid accumulation window
    manager = CheckpointManager(tmp_path / "ckpts", keep_last=1)
    manager.save(e2.global_step, {"agent_a": lambda p: e2.save_checkpoint(p, pos2)}, data_position=pos2)
    torch.randn(100)  # disturb the RNG before resuming

    resumed = _model(tok, seed=99)  # different weights, restored from the checkpoint
    e3 = TorchStrategy().setup(resumed, resumed.parameters(), cfg)
    holder = {}
    meta = manager.load({"agent_a": lambda p: holder.update(pos=e3.load_checkpoint(p))})
    assert meta["data_position"] == holder["pos"] == {"epoch": 0, "offset": 10}
    assert (e3.global_step, e3.micro_step) == (2, 5)
    _train(e3, resumed, 7, holder["pos"])
    assert holder["pos"] == pos1
    assert e3.global_step == e1.global_step == 6 and e3.lr == e1.lr
    a, b = _params(straight), _params(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_checkpoint_manager_rotation_and_errors(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=2)
    for step in (1, 2, 3):
        manager.save(
            step, {"unit": lambda p, s=step: (p / "x").write_text(str(s))}, data_position={"s": step}
        )
    assert manager.steps() == [2, 3] and manager.latest().name == "step-000003"
    (tmp_path / ".tmp-step-000004").mkdir()  # an interrupted save is never "latest"
    assert manager.latest().name == "step-000003"
    seen = {}
    meta = manager.load({"unit": lambda p: seen.update(x=(p / "x").read_text())})
    assert seen["x"] == "3" and meta["data_position"] == {"s": 3}
    with pytest.raises(NotFoundError):
        manager.load({"other": lambda p: None})
    with pytest.raises(NotFoundError):
        CheckpointManager(tmp_path / "empty").load({})
    with pytest.raises(InvalidArgumentError):
        CheckpointManager(tmp_path, keep_last=0)


def test_make_strategy_by_name():
    assert isinstance(make_strategy("torch"), TorchStrategy)
    with pytest.raises(InvalidArgumentError):
        make_strategy("fsdp")


@pytest.mark.slow
def test_deepspeed_zero_stages_train_and_resume_on_cpu(tok, tmp_path):
    """ZeRO 0-3 on CPU with gloo: loss goes down, checkpoints restore weights exactly (first run JIT-builds ~35 s)."""
    from services.trainer.strategy.deepspeed_strategy import DeepSpeedStrategy

    with pytest.raises(InvalidArgumentError):
        DeepSpeedStrategy(zero_stage=4)
    ids = torch.randint(0, 1000, (2, 10), generator=torch.Generator().manual_seed(0))
    for stage in (0, 1, 2, 3):
        model = _model(tok)
        eng = DeepSpeedStrategy(zero_stage=stage).setup(
            model, list(model.parameters()), OptimConfig(lr=1e-2, grad_accum_steps=2, total_steps=10)
        )
        losses = []
        for _ in range(8):
            loss = _loss(eng.model, ids)
            losses.append(float(loss))
            eng.backward(loss)
            result = eng.step()
        assert result.stepped and result.grad_norm is not None and eng.global_step == 4
        assert losses[-1] < losses[0], (stage, losses)
        eng.save_checkpoint(tmp_path / f"z{stage}", {"offset": 8})
        with eng.gathered():
            saved = {n: p.detach().clone() for n, p in eng.model.named_parameters()}
        other = _model(tok, seed=5)
        eng2 = DeepSpeedStrategy(zero_stage=stage).setup(
            other, list(other.parameters()), OptimConfig(lr=1e-2, grad_accum_steps=2, total_steps=10)
        )
        assert eng2.load_checkpoint(tmp_path / f"z{stage}") == {"offset": 8}
        assert eng2.global_step == 4
        with eng2.gathered():
            assert all(torch.equal(saved[n], p) for n, p in eng2.model.named_parameters()), stage


def test_resume_trains_at_the_configured_learning_rate_not_the_checkpoints(tok, tmp_path):
    """``--resume --set learning_rate=X``: the optimizer and scheduler states saved by the old run carry its rate;
    after loading, the engine trains at the configured one (same schedule position, same Adam moments)."""
    old = OptimConfig(lr=1e-3, total_steps=8, lr_scheduler="constant", weight_decay=0.0)
    model = _model(tok)
    e1 = TorchStrategy().setup(model, model.parameters(), old)
    _train(e1, model, 2, {"offset": 0})
    e1.save_checkpoint(tmp_path / "c", {"offset": 2})
    new = OptimConfig(lr=0.5, total_steps=8, lr_scheduler="constant", weight_decay=0.01)
    other = _model(tok, seed=3)
    e2 = TorchStrategy().setup(other, other.parameters(), new)
    e2.load_checkpoint(tmp_path / "c")
    assert e2.lr == pytest.approx(0.5)
    assert e2.scheduler.base_lrs == [0.5] and e2.scheduler.get_last_lr() == [pytest.approx(0.5)]
    assert e2.optimizer.param_groups[0]["weight_decay"] == 0.01
    assert e2.optimizer.state  # the Adam moments were loaded
    e2.scheduler.step()
    assert e2.lr == pytest.approx(0.5)  # the schedule keeps the new rate


@pytest.mark.parametrize("flags, warned", [("fpu avx512f", True), ("fpu avx512f amx_bf16", False)])
def test_bf16_on_a_cpu_without_native_bf16_warns_naming_the_setting(tmp_path, caplog, flags, warned):
    from services.trainer.strategy.base import resolve_bf16

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    with caplog.at_level("WARNING", logger="services.trainer.strategy.base"):
        assert resolve_bf16(True, torch.device("cpu"), cpuinfo) is True  # kept: the setting is the user's
        assert resolve_bf16(False, torch.device("cpu"), cpuinfo) is False
    assert any("strategy.bf16=true" in r.getMessage() for r in caplog.records) is warned


def _private_anonymous_bytes() -> int:
    """Bytes of this process's private writable anonymous mappings (/proc/self/maps)."""
    total = 0
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split()
            start, end = (int(x, 16) for x in parts[0].split("-"))
            if parts[1].startswith("rw") and parts[1].endswith("p") and len(parts) < 6:
                total += end - start
    return total


def test_deepspeed_buckets_fit_the_model_and_engines_hold_no_gigabyte_buffers(tok):
    """DeepSpeed's default 5e8-element buckets made every ZeRO 1-3 engine allocate GBs of (untouched) buffers that
    a process never returned: a ZeRO-1 and a ZeRO-3 engine of the tiny model took 2.1-3.7 GB of address space."""
    from services.trainer.strategy.deepspeed_strategy import (
        DEEPSPEED_BUCKET_ELEMENTS,
        DeepSpeedStrategy,
        bucket_elements,
    )

    cfg = OptimConfig(lr=1e-2, total_steps=10)
    assert bucket_elements(1234) == 1280 and bucket_elements(0) == 64 and bucket_elements(128) == 128
    assert bucket_elements(10**12) == DEEPSPEED_BUCKET_ELEMENTS
    zero = DeepSpeedStrategy(zero_stage=2).ds_config(cfg, False, 1234)["zero_optimization"]
    assert zero["reduce_bucket_size"] == zero["allgather_bucket_size"] == 1280
    assert (
        "reduce_bucket_size"
        not in DeepSpeedStrategy(zero_stage=0).ds_config(cfg, False, 1234)["zero_optimization"]
    )
    ids = torch.randint(0, 1000, (2, 10), generator=torch.Generator().manual_seed(0))
    before = _private_anonymous_bytes()
    for stage in (1, 3):  # stage 1 allocated its buffers at the first step, stage 3 at setup
        model = _model(tok)
        engine = DeepSpeedStrategy(zero_stage=stage).setup(model, list(model.parameters()), cfg)
        engine.backward(_loss(engine.model, ids))
        engine.step()
    assert _private_anonymous_bytes() - before < 2**30
