"""Unit tests of services.trainer.observe.metrics: RunWriter files, TensorBoard events, readers."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest

from marti.config import config_from_text, load_config
from marti.errors import FailedPreconditionError, InvalidArgumentError
from services.trainer.observe.metrics import RunWriter, flatten_table, read_evals, read_metrics, series

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "tiny.yaml"


class FakeClock:
    """A deterministic wall clock: each call advances one second."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def test_jsonl_lines_config_and_nonfinite(tmp_path):
    cfg = load_config(EXAMPLE)
    with RunWriter(tmp_path, cfg, use_tensorboard=False, clock=FakeClock()) as w:
        w.log(0, {"agent_1/reward": 0.5, "agent_1/kl": math.nan, "team/reward": 1})
        w.log(1, {"agent_1/reward": -math.inf})
        w.log_eval(1, {"team": {"task_completion": 0.25}, "agent_1/reward": 2.0})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[0]) == {
        "step": 0,
        "time": 1001.0,
        "metrics": {"agent_1/reward": 0.5, "agent_1/kl": "nan", "team/reward": 1.0},
    }
    recs = read_metrics(tmp_path)
    assert [r.step for r in recs] == [0, 1]
    assert math.isnan(recs[0].values["agent_1/kl"]) and recs[1].values["agent_1/reward"] == -math.inf
    (ev,) = read_evals(tmp_path)
    assert ev.values == {"team/task_completion": 0.25, "agent_1/reward": 2.0}
    assert config_from_text((tmp_path / "config.yaml").read_text()) == cfg


def test_resume_replaces_the_abandoned_timeline(tmp_path):
    with RunWriter(tmp_path, use_tensorboard=False) as w:
        for s in range(5):
            w.log(s, {"x/reward": float(s)})
    with RunWriter(tmp_path, use_tensorboard=False) as w:  # resumed from the step-2 checkpoint
        w.log(3, {"x/reward": 30.0})
    steps, values = series(read_metrics(tmp_path), "x/reward")
    assert steps == [0, 1, 2, 3] and values == [0.0, 1.0, 2.0, 30.0]


def test_truncated_last_line_is_skipped_but_corruption_is_named(tmp_path, caplog):
    with RunWriter(tmp_path, use_tensorboard=False) as w:
        w.log(0, {"a/reward": 1.0})
        w.log(1, {"a/reward": 2.0})
    path = tmp_path / "metrics.jsonl"
    path.write_text(path.read_text() + '{"step": 2, "ti')
    with caplog.at_level(logging.WARNING):
        assert [r.step for r in read_metrics(tmp_path)] == [0, 1]
    assert "truncated" in caplog.text
    path.write_text("garbage\n" + path.read_text())
    with pytest.raises(InvalidArgumentError, match=r"metrics.jsonl:1"):
        read_metrics(tmp_path)


@pytest.mark.parametrize(
    ("step", "metrics", "fragment"),
    [
        (-1, {"a": 1.0}, "step must be an int >= 0, got -1"),
        (1.5, {"a": 1.0}, "got 1.5"),
        (True, {"a": 1.0}, "got True"),
        (0, {"": 1.0}, "non-empty string"),
        (0, {"a/reward": "high"}, "metric 'a/reward' must be a real number, got 'high'"),
        (0, {"a/reward": True}, "got True"),
        (0, [1, 2], "must be a mapping"),
    ],
)
def test_bad_input_is_named(tmp_path, step, metrics, fragment):
    with RunWriter(tmp_path, use_tensorboard=False) as w, pytest.raises(InvalidArgumentError) as info:
        w.log(step, metrics)
    assert fragment in str(info.value)
    assert read_metrics(tmp_path) == []


def test_closed_writer_refuses(tmp_path):
    w = RunWriter(tmp_path, use_tensorboard=False)
    w.close()
    w.close()
    with pytest.raises(FailedPreconditionError, match="closed"):
        w.log(0, {"a": 1.0})


def test_flatten_table():
    assert flatten_table({"team": {"a": 1, "b": {"c": 2}}, "d": 3}) == {"team/a": 1, "team/b/c": 2, "d": 3}


def test_tensorboard_events_hold_the_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = load_config(EXAMPLE, [f"output.dir={tmp_path}", "output.log_with=[tensorboard]"])
    with RunWriter.from_config(cfg) as w:
        for s in range(3):
            w.log(s, {"agent_1/reward": 0.1 * s, "team/task_completion": s / 4})
        w.log_eval(2, {"team/reward": 0.75})
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert {"agent_1/reward", "team/task_completion", "eval/team/reward"} <= set(tags)
    assert [round(e.value, 6) for e in acc.Scalars("agent_1/reward")] == [0.0, 0.1, 0.2]
    assert [e.step for e in acc.Scalars("eval/team/reward")] == [2]


def test_wandb_requested_but_missing_warns_and_continues(tmp_path, caplog):
    import importlib.util

    if importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed; this checks the missing-package path")
    with caplog.at_level(logging.WARNING), RunWriter(tmp_path, use_tensorboard=False, wandb=True) as w:
        w.log(0, {"a/reward": 1.0})
    assert "wandb is not installed" in caplog.text
    assert len(read_metrics(tmp_path)) == 1
