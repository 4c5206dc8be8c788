"""The workflow examples over dataset problems (examples/data/*.yaml on rows of scripts/data/make_arithmetic_data.py):
each config loads and fits its data, and one episode played through the episode runner on the real
``dataset_task`` env with scripted replies shows who spoke when, what each agent saw of its teammates, the team's
answer and each agent's reward; the config check of ``max_turns`` against the workflow; the LLM judge."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

import marti
from marti.config import config_from_dict, load_config
from marti.errors import DeadlineExceededError, InvalidArgumentError
from marti.rewards import make_verifier
from marti.rewards.judge import read_verdict
from marti.team.workflow import workflow_from_section
from scripts.data.make_arithmetic_data import main as make_data
from scripts.data.make_arithmetic_data import make_rows
from services.trainer.data.tasks import DatasetTasks
from services.trainer.rollout.episodes.runner import EpisodeRunner
from services.trainer.rollout.episodes.scoring import EpisodeScorer, build_scorer
from tests.unit.trainer.data.test_dataset_tasks import _Gen

EXAMPLES = Path(__file__).resolve().parents[4] / "examples" / "data"
SEED = 3


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    """The working directory, holding data/arithmetic.jsonl as the examples' commands write it."""
    monkeypatch.chdir(tmp_path)
    assert make_data(["--count", "40", "--out", "data/arithmetic.jsonl"]) == 0
    return tmp_path


def test_the_data_script_is_seeded_and_its_latex_rows_are_read_by_math_verify():
    assert (
        make_rows(30, seed=1, latex_every=3) == make_rows(30, seed=1, latex_every=3) != make_rows(30, seed=2)
    )
    rows = make_rows(30, seed=1, latex_every=3)
    latex = [r for i, r in enumerate(rows) if (i + 1) % 3 == 0]
    assert all("\\boxed" in r["prompt"] for r in latex) and any("\\frac" in r["answer"] for r in latex)
    assert all(r["answer"].lstrip("-").isdigit() for i, r in enumerate(rows) if (i + 1) % 3)
    math = make_verifier("math")
    for r in latex:
        assert math(f"So the share is $\\boxed{{{r['answer']}}}$.", r["answer"]) == 1.0
    frac = next(r for r in latex if "\\frac" in r["answer"])
    p, q = (int(x) for x in frac["answer"][6:-1].split("}{"))
    assert math(f"Answer: {p / q}", frac["answer"]) == 1.0  # the same value as a decimal


def _play(cfg, replies: dict[str, list[str]]) -> tuple[Any, list[tuple[str, str]], str]:
    """One episode of problem ``SEED``; ``replies[agent]`` are its replies in order (``{answer}`` and
    ``{wrong}`` filled in). Returns the result, ``(agent, user message)`` of every call, and the row's answer."""
    tasks = DatasetTasks(cfg)
    cfg = tasks.fit(cfg)
    answer = tasks.row(SEED)["answer"]
    wrong = str(int(answer) + 1)
    calls: list[tuple[str, str]] = []
    said: dict[str, int] = {}

    def generate(agent: str, chats: list) -> list[_Gen]:
        out = []
        for chat in chats:
            calls.append((agent, chat[-1]["content"]))
            k = said.get(agent, 0)
            said[agent] = k + 1
            out.append(_Gen(replies[agent][k].format(answer=answer, wrong=wrong)))
        return out

    names = [a.name for a in cfg.agents]
    scorer = EpisodeScorer(cfg, tasks, build_scorer(cfg, None)) if cfg.reward.active else None
    runner = EpisodeRunner(
        make_env=lambda seed: marti.make("dataset_task", seed=seed, **tasks.env_config(cfg, seed)),
        generate=generate,
        comm_factory=None,
        agents=names,
        roles={a.name: a.role for a in cfg.agents},
        system_prompts={a: "s" for a in names},
        policy_version=lambda a: 0,
        workflow=workflow_from_section(cfg.workflow, names, cfg),
        rescore=scorer.rescore if scorer else None,
    )
    (result,) = runner.play([SEED])
    return result, calls, answer


def _speakers(result) -> list[tuple[int, str]]:
    return [(step, agent) for step, agent, _ in result.transcript]


def test_single_solver_answers_alone(data_dir):
    result, calls, answer = _play(
        load_config(EXAMPLES / "single_solver.yaml"), {"solver": ["Answer: {answer}"]}
    )
    assert _speakers(result) == [(0, "solver")]
    assert "Messages from your teammates" not in calls[0][1]
    assert result.metrics["task_completion"] == 1.0
    assert result.returns == {"solver": 1.0}


def test_debate_solvers_see_each_other_then_the_aggregator_answers(data_dir):
    replies = {
        "solver_1": ["Answer: {answer}", "Answer: {answer}"],
        "solver_2": ["Answer: {wrong}", "Still Answer: {wrong}"],
        "solver_3": ["Answer: {wrong}", "I agree with solver_1. Answer: {answer}"],
        "aggregator": ["Answer: {answer}"],
    }
    result, calls, answer = _play(load_config(EXAMPLES / "debate.yaml"), replies)
    solvers = ["solver_1", "solver_2", "solver_3"]
    assert _speakers(result) == [(0, s) for s in solvers] + [(1, s) for s in solvers] + [(2, "aggregator")]
    second = dict(calls[3:6])  # round 2: each solver saw the two others' round-1 answers
    assert f"[solver_2]: Answer: {int(answer) + 1}" in second["solver_1"]
    assert f"[solver_1]: Answer: {answer}" in second["solver_3"] and "[solver_3]" not in second["solver_3"]
    assert f"[solver_3]: I agree with solver_1. Answer: {answer}" in calls[6][1]  # the aggregator saw round 2
    assert result.metrics["task_completion"] == 1.0
    # team part 0.5 * 1 + own part 0.5 * (own last answer correct)
    assert result.returns == {"solver_1": 1.0, "solver_2": 0.5, "solver_3": 1.0, "aggregator": 1.0}


@pytest.mark.parametrize(
    ("third", "team", "returns"),
    [
        ("Answer: {answer}", 1.0, {"solver_1": 1.0, "solver_2": 0.5, "solver_3": 1.0}),
        ("Answer: {wrong}", 0.0, {"solver_1": 0.5, "solver_2": 0.0, "solver_3": 0.0}),
    ],
)
def test_debate_by_majority_vote_has_no_aggregator(data_dir, third, team, returns):
    replies = {
        "solver_1": ["Answer: {answer}"] * 2,
        "solver_2": ["Answer: {wrong}"] * 2,
        "solver_3": ["Answer: {wrong}", third],
    }
    result, calls, answer = _play(load_config(EXAMPLES / "debate_majority.yaml"), replies)
    solvers = ["solver_1", "solver_2", "solver_3"]
    assert _speakers(result) == [(0, s) for s in solvers] + [(1, s) for s in solvers]
    assert f"[solver_1]: Answer: {answer}" in dict(calls[3:6])["solver_2"]
    assert result.metrics["task_completion"] == team
    assert result.returns == returns


def test_chain_generator_verifier_refiner_and_the_refiner_answers(data_dir):
    replies = {
        "generator": ["Answer: {wrong}"],
        "verifier": ["That is not right: recount the items."],
        "refiner": ["Answer: {answer}"],
    }
    result, calls, answer = _play(load_config(EXAMPLES / "chain.yaml"), replies)
    assert _speakers(result) == [(0, "generator"), (1, "verifier"), (2, "refiner")]
    assert f"[generator]: Answer: {int(answer) + 1}" in calls[1][1]
    assert "[generator]" in calls[2][1] and "[verifier]: That is not right" in calls[2][1]
    assert result.metrics["task_completion"] == 1.0  # the refiner's answer is the team's
    assert result.returns == {"generator": 0.5, "verifier": 0.5, "refiner": 1.0}


@pytest.mark.parametrize(
    ("verdict", "reward", "unreadable"),
    [("Verdict: correct", 1.0, 0.0), ("checked.\nVerdict: 0.25", 0.25, 0.0), ("I cannot tell.", 0.0, 1.0)],
)
def test_the_frozen_judges_verdict_is_the_reward(data_dir, caplog, verdict, reward, unreadable):
    cfg = load_config(EXAMPLES / "judged.yaml")
    assert not cfg.agent("judge").is_tuning and cfg.tuning_agents == ["solver"]
    with caplog.at_level(logging.WARNING, logger="services.trainer.rollout.episodes.scoring"):
        result, calls, answer = _play(cfg, {"solver": ["Answer: {wrong}"], "judge": [verdict]})
    assert _speakers(result) == [(0, "solver"), (1, "judge")]
    assert f"[solver]: Answer: {int(answer) + 1}" in calls[1][1]  # the judge saw the answer it judges
    assert result.metrics["task_completion"] == 0.0  # the verifier: the solver's answer is wrong
    assert result.returns["solver"] == reward  # the judge's verdict, not the verifier's
    assert result.metrics["judge/unreadable"] == unreadable
    assert ("no verdict readable" in caplog.text) == bool(unreadable)


@pytest.mark.parametrize(
    ("reply", "verdict"),
    [
        ("Verdict: correct", 1.0),
        ("verdict: **Incorrect**.", 0.0),
        ("Verdict: yes\n...\nVerdict: no", 0.0),
        ("VERDICT = 1", 1.0),
        ("Verdict: 0.5", 0.5),
        ("verdict: 1/2", 0.5),  # a half, not 1
        ("Verdict: 3/4", 0.75),
        ("Verdict: 0,8", 0.8),  # a decimal comma, not 0
        ("Verdict: correct, because it adds up", 1.0),
        ("Verdict: 5/4", None),
        ("Verdict: 7", None),
        ("Verdict: maybe", None),
        ("correct", None),
        ("", None),
    ],
)
def test_read_verdict(reply, verdict):
    assert read_verdict(reply) == verdict


def _example(name: str, **changes: Any) -> dict[str, Any]:
    data = yaml.safe_load((EXAMPLES / name).read_text())
    for dotted, value in changes.items():
        *path, key = dotted.split("__")
        node = data
        for p in path:
            node = node[p]
        node[key] = value
    return data


@pytest.mark.parametrize(
    ("name", "changes", "message"),
    [
        ("debate.yaml", {"environment__max_turns": 2}, "max_turns is 2 but workflow.kind debate takes 3"),
        ("chain.yaml", {"environment__max_turns": 1}, "max_turns is 1 but workflow.kind chain takes 3"),
        (
            "debate.yaml",
            {"workflow__kind": "parallel_aggregate"},
            "max_turns is 3 but .*parallel_aggregate takes 2",
        ),
    ],
)
def test_max_turns_must_be_the_workflows_turns(data_dir, name, changes, message):
    with pytest.raises(InvalidArgumentError, match=message):
        config_from_dict(_example(name, **changes))


def test_a_bad_judge_is_refused_at_config_load(data_dir):
    cfg = _example("judged.yaml")
    cfg["agents"][1]["is_tuning"] = True
    with pytest.raises(InvalidArgumentError, match="'judge' must set is_tuning: false"):
        config_from_dict(cfg)
    bad = {
        "reward__judge_agent": ("critic", "'critic' is not in agents"),
        "workflow__order": (["judge", "solver"], "must speak last"),
        "environment__options": ({"verifier": "numeric"}, "needs environment.options.final_agent"),
        "reward__functions": (["x.py:f"], "leave out reward.functions"),
        "reward__judge_pattern": ("(", "does not compile"),
        "reward__judge_pattern_timeout_s": (0, "greater than 0"),
    }
    for key, (value, message) in bad.items():
        with pytest.raises(InvalidArgumentError, match=message):
            config_from_dict(_example("judged.yaml", **{key: value}))


#: A pattern that backtracks catastrophically on 40 a's and a b: Python's ``re`` tries about 2**40 ways (the job
#: hung). (The brief's ``(a+)+$`` is one the ``regex`` package answers at once, so it shows nothing.)
EVIL = (r"(a|a)+$", "a" * 40 + "b")


def test_a_verdict_pattern_past_its_time_limit_is_a_typed_error():
    start = time.monotonic()
    with pytest.raises(
        DeadlineExceededError, match=r"ran past reward.judge_pattern_timeout_s 0.2 s on a reply of 41"
    ):
        read_verdict(EVIL[1], EVIL[0], timeout_s=0.2)
    assert time.monotonic() - start < 10  # unbounded, it runs for hours
    either = r"Verdict: (\w+)|(a|a)+$"
    assert read_verdict("Verdict: yes", either, timeout_s=5.0) == 1.0  # a reply it reads (in microseconds)
    with pytest.raises(DeadlineExceededError):
        read_verdict(EVIL[1], either, timeout_s=0.2)


def test_a_match_without_group_1_is_no_verdict():
    """It raised AttributeError ('NoneType' object has no attribute 'strip') inside the scorer."""
    assert read_verdict("N/A", r"Verdict: (\w+)|N/A") is None


def test_a_judge_pattern_that_backtracks_is_scored_0_with_a_warning_and_the_job_goes_on(data_dir, caplog):
    cfg = config_from_dict(
        _example("judged.yaml", reward__judge_pattern=EVIL[0], reward__judge_pattern_timeout_s=0.2)
    )
    with caplog.at_level(logging.WARNING, logger="services.trainer.rollout.episodes.scoring"):
        result, _, _ = _play(cfg, {"solver": ["Answer: {answer}"], "judge": [EVIL[1]]})
    assert result.returns["solver"] == 0.0
    assert result.metrics["judge/unreadable"] == 1.0
    assert "ran past reward.judge_pattern_timeout_s 0.2 s" in caplog.text


def test_judge_pattern_reads_the_verdict(data_dir):
    reply = "Grade: 1\nVerdict: incorrect"
    default = load_config(EXAMPLES / "judged.yaml")
    result, _, _ = _play(default, {"solver": ["Answer: {answer}"], "judge": [reply]})
    assert result.returns["solver"] == 0.0
    graded = config_from_dict(_example("judged.yaml", reward__judge_pattern=r"Grade: (\d)"))
    result, _, _ = _play(graded, {"solver": ["Answer: {answer}"], "judge": [reply]})
    assert result.returns["solver"] == 1.0
