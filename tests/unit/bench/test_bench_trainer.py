"""The trainer benchmark's pure parts: the task's reward and the 'equal or better reward' verdict."""

from __future__ import annotations

import json

import pytest

from benchmarks import sum_task, trainer
from benchmarks.trainer import reward_comparison


def _side(tail, scores):
    return {
        "tail_rewards": tail,
        "tail_reward": sum(tail) / len(tail),
        "eval_scores": scores,
        "eval_reward": sum(scores) / len(scores),
    }


def test_task_reward_scores_the_first_integer():
    assert sum_task.reward("The answer is 35.", 35) == sum_task.CORRECT_REWARD
    assert sum_task.reward("34, no 35", 35) == sum_task.NUMBER_REWARD
    assert sum_task.reward("thirty-five", 35) == 0.0
    problems = sum_task.make_problems(3, 5)
    assert problems == sum_task.make_problems(3, 5) and len(problems) == 5
    with pytest.raises(ValueError):
        sum_task.make_problems(0, -1)


def test_a_difference_inside_one_standard_error_counts_as_equal():
    ours = _side([0.088, 0.081, 0.144, 0.1], [0.1, 0.1, 1.0, 0.1])
    trl = _side([0.138, 0.088, 0.088, 0.1], [0.1, 0.1, 1.0, 0.1])
    ok, text = reward_comparison(ours, trl)
    assert ok and "training -0.000" in text and "held-out +0.000 (paired SE 0.000)" in text


def test_a_clearly_lower_reward_is_not_equal():
    ours = _side([0.05, 0.05, 0.05, 0.05], [0.1, 0.1, 0.1, 0.1])
    trl = _side([0.3, 0.31, 0.29, 0.3], [0.1, 0.1, 0.1, 0.1])
    assert not reward_comparison(ours, trl)[0]
    # Held-out, paired per problem: TRL right on two problems ours misses, never the reverse.
    ours = _side([0.1, 0.1], [0.1, 0.1, 0.1, 0.1])
    trl = _side([0.1, 0.1], [1.0, 1.0, 0.1, 0.1])
    assert not reward_comparison(ours, trl)[0]
    assert reward_comparison(trl, ours)[0]  # better is fine


def test_report_only_writes_the_sides_the_ratios_and_the_verdict_as_json(tmp_path, capsys):
    spec = {
        "model": "smollm2-135m-instruct",
        "steps": 4,
        "prompts_per_step": 2,
        "group_size": 2,
        "max_new_tokens": 8,
        "temperature": 1.0,
    }
    spec |= {
        "lr": 1e-4,
        "lora": False,
        "threads": 2,
        "seed": 0,
        "train_problems": [[1, 2]],
        "eval_problems": [],
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    (tmp_path / "init_eval.json").write_text(json.dumps({"reward": 0.1, "accuracy": 0.0}))

    def side(train_s, rewards):
        return {
            "train_time_s": train_s, "samples": 16, "completion_tokens": 64, "prompt_tokens": 128,
            "step_times_s": [train_s / 4] * 4, "step_rewards": rewards,
            "eval": {"reward": 0.2, "accuracy": 0.1, "scores": [0.1, 0.3]}, "load": 1.5,
        }  # fmt: skip

    (tmp_path / "ours_0.json").write_text(json.dumps(side(10.0, [0.1, 0.2, 0.3, 0.4])))
    (tmp_path / "trl_0.json").write_text(json.dumps(side(20.0, [0.1, 0.2, 0.3, 0.4])))
    path = tmp_path / "out.json"
    assert trainer.main(["--report-only", "--out", str(tmp_path), "--json", str(path), "--model", "m"]) == 0
    doc = json.loads(path.read_text())
    assert doc["bench"] == "trainer" and "train_problems" not in doc["spec"] and doc["spec"]["steps"] == 4
    assert [s["side"] for s in doc["sides"]] == ["ours", "trl"]
    c = doc["comparison"]
    assert (
        c["samples_per_s_ratio"] == pytest.approx(2.0)
        and c["reward_ok"]
        and c["met"] == (2.0 >= c["target_ratio"])
    )
    assert len(doc["loadavg_after"]) == 3
    printed = capsys.readouterr().out
    assert (
        "samples/s 2.00x" in printed and "model smollm2-135m-instruct," in printed
    )  # the run's, not --model's
    table = (tmp_path / "table.md").read_text().splitlines()  # a Markdown table, as printed
    assert (
        table[0].startswith("| side | train s | samples/s |") and "| reward last 1 of 4 steps |" in table[0]
    )
    assert table[1] == "|---|" + "---:|" * 11 and table[2].startswith("| ours | 10.0 | 1.60 | 6.4 | 19.2 |")
    assert table[3].startswith("| trl | 20.0 | 0.80 |") and table[4].endswith("| 0.100 (0.00) |  |")
    assert all(line in printed for line in table)


def test_report_only_without_an_earlier_run_says_so_and_creates_nothing(tmp_path):
    missing = tmp_path / "nothing"
    with pytest.raises(
        SystemExit, match=r"--report-only: no earlier run in .*nothing \(its spec.json is missing\)"
    ):
        trainer.main(["--report-only", "--out", str(missing)])
    assert not missing.exists()
    (tmp_path / "spec.json").write_text(json.dumps({"steps": 4}))
    (tmp_path / "init_eval.json").write_text(json.dumps({"reward": 0.1, "accuracy": 0.0}))
    with pytest.raises(SystemExit, match=r"no side results in .*ours_\*.json, trl_\*.json"):
        trainer.main(["--report-only", "--out", str(tmp_path)])
