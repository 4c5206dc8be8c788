"""Held-out evaluation of a dataset job through the training loop's own eval path (``_evaluate``,
``evaluate_checkpoint``): real env server and comm broker processes, the real ``dataset_task`` env, scripted
replies in place of the models. ``rollout.eval_samples`` 3 samples each held-out row 3 times and logs pass@k and
the majority vote; 1 keeps the greedy evaluation without them."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from marti.command.stack import LocalStack
from marti.config import config_from_dict
from services.trainer.job.connections.addresses import Addresses
from services.trainer.job.run import loop as loop_mod
from services.trainer.job.run.summary import RunSummary
from services.trainer.observe.metrics import RunWriter
from services.trainer.observe.report import write_report

ROWS = [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(10)]


@pytest.fixture(scope="module")
def stack() -> Iterator[dict[str, str]]:
    """A real comm broker and env server on free ports; yields their addresses."""
    services = LocalStack(services=("broker", "env-server"))
    try:
        yield services.start()
    finally:
        services.stop()


class _Gen:
    def __init__(self, text: str) -> None:
        self.text, self.prompt_token_ids, self.response_token_ids, self.response_logprobs = (
            text,
            [1],
            [2],
            [-1.0],
        )


class _Runtime:
    """Scripted models: the solver always answers right; the checker (whose answer is the team's) answers a
    row right on its 1st and 3rd sample and ``999`` on its 2nd, so each row is solved by 2 of 3 samples."""

    def __init__(self) -> None:
        self.greedy: set[bool] = set()
        self.checker_calls: Counter[int] = Counter()

    def versions(self) -> dict[str, int]:
        return {"solver": 0, "checker": 0}

    def generate(self, agent: str, chats: list[list[dict[str, str]]], greedy: bool = False) -> list[_Gen]:
        self.greedy.add(greedy)
        out = []
        for chat in chats:
            i = int(re.search(r"What is (\d+) \+", " ".join(m["content"] for m in chat)).group(1))
            if agent == "checker":
                self.checker_calls[i] += 1
                wrong = self.checker_calls[i] % 3 == 2
            out.append(_Gen(f"Answer: {999 if agent == 'checker' and wrong else 2 * i}"))
        return out

    def start(self) -> None:
        pass

    def load(self, checkpoint: str) -> None:
        pass

    def shutdown(self) -> None:
        pass


def _loop(tmp_path: Path, stack: dict[str, str], samples: int) -> Any:
    tmp_path.mkdir(exist_ok=True)
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    cfg = config_from_dict(
        {
            "training_name": f"eval{samples}",
            "agents": [
                {"name": "solver", "pretrain_model": "tiny-llama", "role": "solver"},
                {"name": "checker", "pretrain_model": "tiny-llama", "role": "checker"},
            ],
            "dataset": {"path": f"jsonl:{data}", "eval_fraction": 0.3},
            "rollout": {"episodes_per_step": 4, "group_size": 2, "eval_every": 1, "eval_samples": samples},
            "environment": {"max_turns": 2, "options": {"verifier": "numeric", "final_agent": "checker"}},
            "workflow": {"kind": "chain", "order": ["solver", "checker"]},
            "output": {"dir": str(tmp_path / "runs")},
        }
    )
    addresses = Addresses(stack["broker"], stack["env-server"], "unused:1")
    return loop_mod.TrainingLoop(cfg, addresses, show_progress=False)


def _evaluate(loop: Any, runtime: _Runtime) -> dict[str, float]:
    loop.run_dir.mkdir(parents=True)
    with RunWriter(loop.run_dir, loop.cfg, use_tensorboard=False) as writer:
        return loop._evaluate(runtime, 0, writer, RunSummary(loop.run_dir))


def test_sampled_evaluation_logs_pass_at_k_and_the_majority_vote(stack, tmp_path, monkeypatch):
    loop, runtime = _loop(tmp_path, stack, 3), _Runtime()
    try:
        metrics = _evaluate(loop, runtime)
    finally:
        loop.close_channels()
    assert runtime.greedy == {False}  # sampled, at the rollout's temperature
    assert sorted(runtime.checker_calls.values()) == [3, 3, 3]  # the 3 held-out rows, 3 samples each
    expected = {"team/task_completion": 2 / 3, "team/accuracy/solver": 1.0, "team/accuracy/checker": 2 / 3,
                "team/pass@1": 2 / 3, "team/pass@2": 1.0, "team/pass@3": 1.0, "team/majority_vote": 1.0}  # fmt: skip
    assert {k: metrics[k] for k in expected} == pytest.approx(expected)
    logged = json.loads((loop.run_dir / "eval.jsonl").read_text().splitlines()[0])
    assert json.dumps(logged).count("pass@") == 3 and "majority_vote" in json.dumps(logged)
    episodes = [json.loads(x) for x in (loop.run_dir / "eval_episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 9 and Counter(e["team_answer"] for e in episodes)["999"] == 3
    report = write_report(loop.run_dir).read_text()
    assert "| 0 | 0.6667 | 0.6667 | 1 | 1 | 0.6667 | 1 | 1 |" in report.split("## Held-out accuracy", 1)[1]

    # marti eval (evaluate_checkpoint) reports the same numbers for the base models and a checkpoint
    loop, runtime = _loop(tmp_path / "ckpt", stack, 3), _Runtime()
    monkeypatch.setattr(loop_mod, "RayRuntime", lambda cfg: runtime)
    out = loop.evaluate_checkpoint(str(tmp_path), baseline=True)
    for part in ("base", "checkpoint"):
        assert {k: out[part][k] for k in expected} == pytest.approx(expected)


def test_one_sample_is_the_greedy_evaluation_without_pass_at_k(stack, tmp_path):
    loop, runtime = _loop(tmp_path, stack, 1), _Runtime()
    try:
        metrics = _evaluate(loop, runtime)
    finally:
        loop.close_channels()
    assert runtime.greedy == {True}
    assert sorted(runtime.checker_calls.values()) == [1, 1, 1]
    assert metrics["team/task_completion"] == 1.0 and metrics["team/accuracy/solver"] == 1.0
    assert not [k for k in metrics if "pass@" in k or "majority" in k]
