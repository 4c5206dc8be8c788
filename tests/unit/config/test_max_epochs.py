"""``max_epochs``: passes over a finite training problem set bound the job (``rollout.num_train_seeds``)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from marti.config import config_from_dict
from marti.config.sections.seeds import epochs_done, steps_for_epochs
from marti.errors import InvalidArgumentError
from services.trainer.job.run.summary import epoch_limit_message
from services.trainer.ray.policy_worker import build_strategy, steps_per_batch


def _cfg(**top) -> object:
    rollout = top.pop("rollout", {})
    data = {
        "training_name": "t",
        "agents": [{"name": "a", "pretrain_model": "m", "role": "planner"}],
        "max_steps": 100,
        "rollout": {"episodes_per_step": 4, "group_size": 2, "num_train_seeds": 6, **rollout},
        **top,
    }
    return config_from_dict(data)


def test_the_job_ends_after_max_epochs_passes_when_that_comes_before_max_steps():
    cfg = _cfg(max_epochs=2)
    # 2 problems per step, 6 problems: 3 steps per pass, 2 passes = 6 steps < max_steps 100.
    assert cfg.epoch_steps == 6 and cfg.total_steps == 6
    played = Counter(s for step in range(cfg.total_steps) for s in cfg.rollout.train_seeds(step))
    assert played == {seed: 2 * 2 for seed in range(6)}  # every problem max_epochs times, group_size each
    assert cfg.epoch_at(3) == 1.0 and cfg.epoch_at(6) == 2.0
    message = epoch_limit_message(cfg)
    assert message is not None and "max_epochs=2" in message and "after step 6" in message


def test_max_steps_still_bounds_the_job_when_it_comes_first():
    cfg = _cfg(max_epochs=3, max_steps=4)
    assert cfg.epoch_steps == 9 and cfg.total_steps == 4 and epoch_limit_message(cfg) is None


def test_a_partial_last_step_rounds_up():
    cfg = _cfg(max_epochs=1, rollout={"num_train_seeds": 5})
    assert cfg.total_steps == 3  # 5 problems at 2 per step: the 3rd step finishes the pass


@pytest.mark.parametrize(
    "extra", [{"rollout": {"num_train_seeds": None}}, {"rollout": {"source": "external"}}]
)
def test_no_epochs_without_a_finite_builtin_problem_set(extra):
    cfg = _cfg(max_epochs=1, **extra)
    assert cfg.epoch_steps is None and cfg.total_steps == 100 and cfg.epoch_at(10) is None
    assert epoch_limit_message(cfg) is None


def test_the_lr_schedule_spans_the_steps_the_job_runs():
    cfg = _cfg(max_epochs=2)
    model = torch.nn.Linear(2, 2)
    engine = build_strategy(cfg, "a", model, list(model.parameters()))
    assert engine.cfg.total_steps == 6 * cfg.algorithm.ppo_epochs * steps_per_batch(cfg)


def test_seed_helpers_hand_computed_and_refuse_bad_input():
    assert steps_for_epochs(3, 4, 10) == 8  # ceil(30 / 4)
    assert steps_for_epochs(3, 4, None) is None
    assert epochs_done(5, 4, 10) == 2.0
    with pytest.raises(InvalidArgumentError):
        steps_for_epochs(0, 4, 10)
