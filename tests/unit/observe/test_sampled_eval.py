"""Held-out evaluation of dataset jobs: pass@k and majority vote over N samples (rollout.eval_samples), and the
report's held-out accuracy section (team, each agent, majority vote, pass@k) with its plot."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from marti.config import load_config
from marti.errors import InvalidArgumentError
from services.trainer.observe.metrics import RunWriter
from services.trainer.observe.report import write_report
from services.trainer.observe.sampled_eval import majority_solved, pass_at_k, sampled_metrics
from services.trainer.rollout.episodes.runner import EpisodeResult

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "resource_allocation.yaml"


@pytest.mark.parametrize("n", [1, 2, 3, 5, 6])
def test_pass_at_k_is_the_chance_that_some_k_subset_solves(n):
    for c in range(n + 1):
        outcomes = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(outcomes, k))
            brute = sum(any(s) for s in subsets) / len(subsets)
            assert pass_at_k(n, c, k) == pytest.approx(brute)


def test_pass_at_k_refuses_impossible_counts():
    for n, c, k in [(0, 0, 1), (3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4)]:
        with pytest.raises(InvalidArgumentError, match="pass@k needs"):
            pass_at_k(n, c, k)


def test_majority_vote_normalises_answers_and_breaks_ties_by_the_first_sample():
    assert majority_solved([("42", True), (" 42 ", True), ("7", False)])
    assert not majority_solved([("7", False), ("42", True), ("７", False)])  # NFKC: full-width 7 is 7
    assert majority_solved([("42", True), ("7", False)])  # a tie: the answer sampled first
    assert not majority_solved([("7", False), ("42", True)])
    with pytest.raises(InvalidArgumentError):
        majority_solved([])


def _ep(seed: int, solved: bool, answer: str | None = None, task: str | None = None) -> EpisodeResult:
    r = EpisodeResult(f"e{seed}", seed, metrics={"task_completion": float(solved)}, task=task)
    r.team_answer = answer
    return r


def test_sampled_metrics_over_problems():
    results = [_ep(1, True, "3"), _ep(1, False, "4"), _ep(1, True, "3")]  # 2 of 3, majority right
    results += [_ep(2, False, "9"), _ep(2, False, "9"), _ep(2, True, "5")]  # 1 of 3, majority wrong
    m = sampled_metrics(results, 3)
    assert m["team/pass@1"] == pytest.approx((2 / 3 + 1 / 3) / 2)
    assert m["team/pass@3"] == pytest.approx(1.0)
    assert m["team/pass@2"] == pytest.approx((1.0 + 2 / 3) / 2)
    assert m["team/majority_vote"] == pytest.approx(0.5)
    no_answers = sampled_metrics([_ep(1, True), _ep(1, False)], 2)  # another env: no team answers, no vote
    assert "team/majority_vote" not in no_answers and no_answers["team/pass@2"] == 1.0
    with pytest.raises(InvalidArgumentError, match=r"played 2 times, not eval_samples=3"):
        sampled_metrics([_ep(1, True), _ep(1, True)], 3)


def test_the_report_shows_held_out_accuracy_per_agent_majority_and_pass_at_k(tmp_path):
    cfg = load_config(EXAMPLE, [f"output.dir={tmp_path}"])
    with RunWriter(tmp_path, cfg, use_tensorboard=False) as w:
        for step, acc in ((0, 0.25), (3, 0.75)):
            w.log(step, {"team/reward": acc})
            w.log_eval(
                step,
                {"team/task_completion": acc, "team/accuracy/solver": acc - 0.1, "team/accuracy/judge": 0.0,
                 "team/majority_vote": acc + 0.05, "team/pass@1": acc, "team/pass@4": min(1.0, acc + 0.2)},
            )  # fmt: skip
    text = write_report(tmp_path).read_text()
    section = text.split("## Held-out accuracy", 1)[1]
    assert "per-agent accuracy" in section.splitlines()[2]  # the note says what each column is
    header = section.splitlines()[4]
    assert header == (
        "| step | team (final answer) | judge (own answer) | solver (own answer) | majority_vote | pass@1 | pass@4 |"
    )
    assert "| 3 | 0.75 | 0 | 0.65 | 0.8 | 0.75 | 0.95 |" in section
    assert (tmp_path / "plots" / "heldout_accuracy.png").read_bytes().startswith(b"\x89PNG")


def test_a_run_without_accuracy_metrics_has_no_such_section(tmp_path):
    cfg = load_config(EXAMPLE, [f"output.dir={tmp_path}"])
    with RunWriter(tmp_path, cfg, use_tensorboard=False) as w:
        w.log(0, {"team/reward": 0.1})
        w.log_eval(0, {"team/task_completion": 0.5})
    assert "## Held-out accuracy" not in write_report(tmp_path).read_text()
    assert not (tmp_path / "plots" / "heldout_accuracy.png").exists()


def test_sampling_at_temperature_0_for_every_agent_is_refused_at_config_load(tmp_path):
    with pytest.raises(InvalidArgumentError, match=r"eval_samples=3 .* every agent's temperature is 0"):
        load_config(EXAMPLE, [f"output.dir={tmp_path}", "rollout.eval_samples=3", "rollout.temperature=0"])
    cfg = load_config(  # one agent that samples is enough
        EXAMPLE,
        [f"output.dir={tmp_path}", "rollout.eval_samples=3", "rollout.temperature=0",
         "agents.0.sampling.temperature=0.7"],
    )  # fmt: skip
    assert cfg.rollout.eval_samples == 3
    assert load_config(EXAMPLE, [f"output.dir={tmp_path}", "rollout.temperature=0"]).rollout.eval_samples == 1
