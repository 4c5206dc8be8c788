"""Unit tests of services.trainer.observe.report: report.md, plots and the honest summary."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from marti.config import load_config
from services.trainer.observe.metrics import RunWriter
from services.trainer.observe.report import describe_change, write_report

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "resource_allocation.yaml"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_describe_change():
    assert describe_change("team reward", 0.1, 0.3) == "team reward went from 0.1 to 0.3 (rose by 0.2)."
    assert describe_change("x", 2.0, 1.5) == "x went from 2 to 1.5 (fell by 0.5)."
    assert describe_change("x", 1.0, 1.0) == "x went from 1 to 1 (unchanged)."
    noisy = describe_change("x", 0.5, 0.55, spread=0.2)
    assert "smaller than the curve's spread (std 0.2)" in noisy
    assert "no trend" in describe_change("x", math.nan, 1.0)


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("run")
    cfg = load_config(EXAMPLE, [f"output.dir={run}"])
    with RunWriter(run, cfg, use_tensorboard=False) as w:
        for s in range(8):
            metrics = {f"agent_{i}/reward": 0.1 * s + 0.01 * i for i in (1, 2, 3)}
            metrics.update({f"agent_{i}/kl": 0.001 * s for i in (1, 2, 3)})
            metrics.update({f"agent_{i}/policy_loss": -0.1 for i in (1, 2, 3)})
            metrics["team/reward"] = 0.1 * s
            metrics["team/task_completion"] = s / 8
            metrics["team/resource_utilization"] = 0.5 + s / 40
            metrics["team/format_valid"] = 0.9
            w.log(s, metrics)
        w.log_eval(0, {"team/reward": 0.2, "team/task_completion": 0.25, "team/resource_utilization": 0.6})
        w.log_eval(4, {"team/reward": 0.3, "team/task_completion": 0.5, "team/resource_utilization": 0.62})
        w.log_eval(7, {"team/reward": 0.5, "team/task_completion": 0.75, "team/resource_utilization": 0.7})
    return run, write_report(run)


def test_report_and_plots_are_written(full_run):
    run, report = full_run
    assert report == run / "report.md"
    text = report.read_text()
    for name in (
        "reward_per_agent",
        "task_completion",
        "resource_utilization",
        "format_valid",
        "training_diagnostics",
    ):
        png = run / "plots" / f"{name}.png"
        assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 5000
        assert f"(plots/{name}.png)" in text
    assert "# Run report: resource_allocation" in text
    assert "agent_2 (executor, smollm2-135m-instruct)" in text


def test_summary_states_what_the_numbers_show(full_run):
    text = full_run[1].read_text()
    assert "team reward on held-out seeds (step 0 to step 7) went from 0.2 to 0.5 (rose by 0.3)" in text
    assert (
        "team task completion on held-out seeds (step 0 to step 7) went from 0.25 to 0.75 (rose by 0.5)"
        in text
    )
    # 8 steps: first and last 2 steps compared; agent_1 rewards 0.01, 0.11 ... 0.71.
    assert (
        "agent_1 reward in training (mean of the first 2 vs the last 2 logged steps) went from 0.06 to 0.66"
        in text
    )


def test_first_versus_last_table(full_run):
    text = full_run[1].read_text()
    assert "| metric | first (step 0) | last (step 7) | change |" in text
    assert "| team/task_completion | 0.25 | 0.75 | +0.5 |" in text
    assert "| team/resource_utilization | 0.6 | 0.7 | +0.1 |" in text


def test_missing_metrics_and_single_eval_are_said_plainly(tmp_path):
    with RunWriter(tmp_path, use_tensorboard=False) as w:
        w.log(0, {"agent_a/reward": 1.0, "agent_a/policy_loss": math.nan})
        w.log(1, {"agent_a/reward": 0.5, "agent_a/policy_loss": 0.2})
        w.log_eval(1, {"team/reward": 0.4, "team/team_score": 0.3})
    text = write_report(tmp_path).read_text()
    assert "Only one held-out evaluation (step 1): team reward 0.4, team score 0.3; no trend." in text
    assert "Not plotted, never logged: task completion rate (no `team/task_completion` metric)." in text
    assert "Non-finite values were logged for: agent_a/policy_loss." in text
    assert (
        "agent_a reward in training (mean of the first 1 vs the last 1 logged steps) went from 1 to 0.5"
        in text
    )
    assert not (tmp_path / "plots" / "task_completion.png").exists()
    assert "format validity" not in text  # optional plot: absent without a note
    assert (tmp_path / "plots" / "reward_per_agent.png").exists()


def test_an_external_job_reports_the_reward_of_the_episodes_it_trained_on(tmp_path):
    """A job that plays no episodes of its own (``rollout.source: external``) logs ``<agent>/external_reward``
    only: the report plots and summarises that instead of saying no reward was logged."""
    with RunWriter(tmp_path, use_tensorboard=False) as w:
        for step, r in enumerate([0.1, 0.2, 0.6, 0.8], start=1):
            w.log(step, {"router/external_reward": r, "router/external_items": 24.0})
    text = write_report(tmp_path).read_text()
    assert (
        "router external reward in training (mean of the first 1 vs the last 1 logged steps) went from 0.1 to 0.8"
        in text
    )
    assert "Not plotted, never logged: reward" not in text
    assert (tmp_path / "plots" / "reward_per_agent.png").exists()


def test_empty_run(tmp_path):
    text = write_report(tmp_path).read_text()
    assert "No training steps were logged." in text
    assert "No held-out evaluation was recorded" in text


@pytest.mark.parametrize(
    ("source", "said"),
    [("builtin", "6 episodes per step"), ("external", "12 external episodes per step"),
     ("mixed", "6 own and 12 external episodes per step")],
)  # fmt: skip
def test_the_overview_counts_the_episodes_an_update_takes_from_its_source(tmp_path, source, said):
    overrides = [f"output.dir={tmp_path}", f"rollout.source={source}", "external.episodes_per_step=12"]
    cfg = load_config(EXAMPLE, [*overrides, "rollout.episodes_per_step=6"])
    with RunWriter(tmp_path, cfg, use_tensorboard=False) as w:
        w.log(0, {"agent_1/reward": 1.0})
    assert f"; {said} in groups of" in write_report(tmp_path).read_text()


def test_a_resumed_run_is_labelled_by_job_with_its_algorithm_and_changes(tmp_path):
    """Two jobs (grpo for steps 1-2, then resumed with rloo and a new learning rate): the report says so per job,
    instead of labelling the whole run with the last algorithm."""
    from services.trainer.job.run.run_dir import RunFolder

    first = load_config(EXAMPLE, [f"output.dir={tmp_path}"])
    second = load_config(
        EXAMPLE, [f"output.dir={tmp_path}", "algorithm.advantage_estimator=rloo", "learning_rate=0.5"]
    )
    folder = RunFolder(tmp_path)
    folder.record_start(first, 0)
    with RunWriter(tmp_path, use_tensorboard=False) as w:
        for step in (1, 2, 3):
            w.log(step, {"agent_1/reward": 0.1 * step})
    folder.resume_from = tmp_path / "checkpoints" / "step_000002"
    folder.record_start(second, 2)
    text = write_report(tmp_path).read_text()
    assert "- Algorithm (last job): rloo;" in text
    assert "  - steps 1 to 2: grpo\n" in text
    assert (
        f"  - steps 3 to 3: rloo (changed: algorithm.advantage_estimator grpo -> rloo, learning_rate {first.learning_rate} -> 0.5)"
        in text
    )


def test_the_report_says_what_the_rollout_engine_and_dtype_resolved_to(tmp_path, monkeypatch):
    """``rollout.engine: hf_static`` with ``rollout.dtype: auto`` on a CPU: the job's start record holds the engine
    and the dtype ``auto`` resolved to there, and report.md shows them."""
    from services.trainer.job.run.run_dir import RunFolder, read_history
    from services.trainer.rollout.engines import precision
    from services.trainer.rollout.engines.generation import generation_config, resolved_rollout

    cfg = load_config(EXAMPLE, [f"output.dir={tmp_path}", "rollout.engine=hf_static", "rollout.dtype=auto"])
    for native, dtype in [(True, "bfloat16"), (False, "float32")]:
        monkeypatch.setattr(precision, "cpu_has_bf16", lambda _path, native=native: native)
        assert resolved_rollout(generation_config(cfg), "cpu") == {"engine": "hf_static", "dtype": dtype}
    auto = load_config(EXAMPLE, [f"output.dir={tmp_path}", "rollout.engine=auto"])
    assert resolved_rollout(generation_config(auto), "cpu")["engine"] == "hf_static"
    # the policy's own dtype (no copy): rollout.dtype null, or auto on a GPU; vLLM samples in its own
    null = load_config(EXAMPLE, [f"output.dir={tmp_path}", "rollout.engine=hf", "rollout.dtype=null"])
    assert resolved_rollout(generation_config(null), "cpu") == {"engine": "hf", "dtype": "policy"}
    assert resolved_rollout(generation_config(cfg), "cuda") == {"engine": "hf_static", "dtype": "policy"}
    vllm = load_config(EXAMPLE, [f"output.dir={tmp_path}", "rollout.engine=vllm", "device=cuda"])
    assert resolved_rollout(generation_config(vllm), "cuda") == {"engine": "vllm", "dtype": "vllm"}
    RunFolder(tmp_path).record_start(cfg, 0, resolved_rollout(generation_config(cfg), "cpu"))
    assert read_history(tmp_path)[-1]["rollout"] == {"engine": "hf_static", "dtype": "float32"}
    with RunWriter(tmp_path, use_tensorboard=False) as w:
        w.log(1, {"agent_1/reward": 0.1})
    assert "- Rollout: engine hf_static, dtype float32\n" in write_report(tmp_path).read_text()


@pytest.mark.parametrize("show_progress", [True, False])
def test_marti_train_prints_the_resolved_rollout_with_its_progress_output_only(capsys, show_progress):
    """The start line ``rollout: engine E, dtype D (...)`` goes to stderr with the progress output; with
    ``--no-progress`` (``show_progress=False``) it is only logged (at INFO, which ``marti train`` does not show)."""
    from types import SimpleNamespace

    from services.trainer.job.run.loop import TrainingLoop

    cfg = load_config(EXAMPLE, ["device=cpu", "rollout.engine=hf", "rollout.dtype=float32"])
    said = TrainingLoop._say_sampling(SimpleNamespace(cfg=cfg, show_progress=show_progress))
    assert said == {"engine": "hf", "dtype": "float32"}
    line = "rollout: engine hf, dtype float32 (rollout.engine=hf, rollout.dtype=float32)\n"
    assert (capsys.readouterr().err == line) is show_progress


def test_the_overview_says_how_many_held_out_problems_the_last_evaluation_played(tmp_path):
    """From eval_episodes.jsonl: a user reading "held-out completion 1.0" sees whether that was 2 problems or 200
    (sampled evaluations play a problem more than once: episodes and problems are both given)."""
    import json

    cfg = load_config(EXAMPLE, [f"output.dir={tmp_path}"])
    with RunWriter(tmp_path, cfg, use_tensorboard=False) as w:
        w.log_eval(0, {"team/reward": 0.2})
        w.log_eval(3, {"team/reward": 0.5})
    records = [{"step": 0, "seed": 9, "task": None}] + [
        {"step": 3, "seed": s, "task": None} for s in (1, 1, 2)
    ]
    (tmp_path / "eval_episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + "{torn\n")
    text = write_report(tmp_path).read_text()
    assert (
        "- Held-out evaluations: 2 (steps [0, 3]); the last played 3 episodes on 2 held-out problems" in text
    )
    (tmp_path / "eval_episodes.jsonl").unlink()
    assert "- Held-out evaluations: 2 (steps [0, 3])\n" in write_report(tmp_path).read_text()
