"""benchmarks.trainer.step_profile on the tiny model: each mode runs our side of the bench and reports."""

from __future__ import annotations

import json

import pytest

from benchmarks.trainer import step_profile, sum_task


def _spec(steps: int = 3) -> dict:
    spec = {"model": "tiny-llama", "model_dir": "tiny-llama", "steps": steps, "prompts_per_step": 1}
    spec |= {"group_size": 2, "max_new_tokens": 4, "temperature": 1.0, "lr": 1e-4, "clip_eps": 0.2}
    spec |= {"grad_clip": 1.0, "lora": False, "seed": 0, "threads": 1, "rollout_engine": "hf_static"}
    spec |= {"rollout_dtype": "float32", "train_dtype": "float32"}
    return spec | {"train_problems": sum_task.make_problems(0, steps), "eval_problems": []}


def test_time_reports_both_phases_and_every_step_loss():
    report = step_profile.run(_spec(), "time", warmup=1)
    assert "median generation" in report and "over steps 2-3" in report
    losses = json.loads(report.split("policy losses: ")[1])
    assert len(losses) == 3


def test_the_lean_mode_alternates_the_engine_forward():
    report = step_profile.run(_spec(4), "lean", warmup=1)
    assert "lean forward on : median generation" in report  # steps 2 and 4 (indices 1, 3 are odd: off)
    assert "lean forward off: median generation" in report


def test_the_lean_mode_refuses_an_engine_without_the_lean_forward():
    """The transformers ``generate`` engine has no lean forward: the A/B would time one forward twice."""
    with pytest.raises(
        ValueError, match="needs rollout_engine hf_static, the spec's engine is HFRolloutEngine"
    ):
        step_profile.run(_spec(4) | {"rollout_engine": "hf"}, "lean", warmup=1)


@pytest.mark.parametrize(
    ("mode", "operator"), [("generation", "aten::searchsorted"), ("update", "Optimizer.step")]
)
def test_a_phase_mode_prints_that_phase_s_operators_only(mode, operator):
    """The sampler's search runs only in generation, the optimizer step only in the update."""
    other = {"aten::searchsorted": "Optimizer.step", "Optimizer.step": "aten::searchsorted"}[operator]
    table = step_profile.run(_spec(2), mode, warmup=1, rows=1000)
    assert "Self CPU" in table and operator in table and other not in table


def test_bad_modes_and_warmups_are_refused(tmp_path, capsys):
    with pytest.raises(ValueError, match="mode must be one of"):
        step_profile.run(_spec(), "both")
    with pytest.raises(ValueError, match=r"--warmup must be in \[0, 3\)"):
        step_profile.run(_spec(), "time", warmup=3)
    with pytest.raises(SystemExit):
        step_profile.main([str(tmp_path / "missing.json"), "time"])
    assert "no spec file at" in capsys.readouterr().err


def test_the_lean_update_mode_alternates_the_training_forward():
    report = step_profile.run(_spec(4), "lean_update", warmup=1)
    assert "lean training forward on : median update" in report  # steps 2 and 4
    assert "lean training forward off: median update" in report
    losses = json.loads(report.split("policy losses (on, off, on, ...): ")[1])
    assert len(losses) == 3


def test_the_lean_update_mode_refuses_steps_that_ran_the_transformers_forward(monkeypatch):
    from services.trainer.models import lean_training

    monkeypatch.setattr(lean_training, "applies", lambda model, num_tokens: False)
    with pytest.raises(ValueError, match="ran the transformers forward with lean_training on"):
        step_profile.run(_spec(4), "lean_update", warmup=1)
