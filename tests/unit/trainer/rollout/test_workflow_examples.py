"""The three workflow examples play and train on the tiny model, in process (no Ray, no gRPC)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from marti.config import load_config
from services.trainer.job.connections.addresses import Addresses
from services.trainer.job.run.loop import TrainingLoop
from services.trainer.observe.episode_metrics import episode_metrics
from services.trainer.ray.policy_worker import PolicyWorker, policy_actor_config
from services.trainer.rollout.episodes.runner import EpisodeRunner
from tests.trainer_data import one_turn

ROOT = Path(__file__).resolve().parents[4]


def _play(name: str, monkeypatch, seeds=(3, 3)):
    monkeypatch.chdir(ROOT)  # the examples name their functions by paths relative to the repository root
    cfg = load_config(ROOT / "examples" / "workflows" / name / f"{name}.yaml", ["rollout.max_new_tokens=4"])
    loop = TrainingLoop(cfg, Addresses(None, None, None), show_progress=False)  # None: in-process envs
    worker = PolicyWorker(policy_actor_config(cfg), num_threads=1)
    runner = EpisodeRunner(
        make_env=loop._make_env,
        generate=lambda agent, chats: worker.generate(agent, chats),
        comm_factory=None,
        agents=[a.name for a in cfg.agents],
        roles={a.name: a.role for a in cfg.agents},
        system_prompts={a.name: f"You are {a.name}, the {a.role}." for a in cfg.agents},
        policy_version=lambda a: worker.versions()[a],
        workflow=loop.workflow,
    )
    return cfg, worker, runner.play(list(seeds))


def _train_one(worker, results, agent):
    samples = [
        one_turn(t.prompt_token_ids, t.response_token_ids, r.returns[agent], r.seed)
        for r in results
        for t in r.trajectories[agent].turns
    ]
    stats = worker.train(agent, samples)
    assert math.isfinite(stats["loss"]) if "loss" in stats else all(math.isfinite(v) for v in stats.values())
    assert worker.versions()[agent] == 1


@pytest.mark.timeout(300)
def test_chain_example_planner_executor_frozen_evaluator(monkeypatch):
    cfg, worker, results = _play("chain", monkeypatch)
    for r in results:
        assert [a for _, a, _ in r.transcript] == ["agent_1", "agent_2", "agent_3"]
        bonus = 1.0 if r.metrics.get("task_completion", 0.0) >= 1.0 else 0.0
        raw = {a: r.env_returns[a] + bonus for a in r.env_returns}
        mean = sum(raw.values()) / len(raw)
        assert r.returns == pytest.approx({a: 0.5 * v + 0.5 * mean for a, v in raw.items()})
        # The evaluator's free text went through the parser, so the env read a well-formed verdict.
        evaluator_turn = r.trajectories["agent_3"].turns[0]
        assert evaluator_turn.info.get("parse_error") in (None, "", False)
    assert "agent_3" not in cfg.tuning_agents
    _train_one(worker, results, "agent_2")
    assert {"team/reward", "agent_1/reward"} <= set(episode_metrics(results))


@pytest.mark.timeout(300)
def test_debate_example_scripted_solver_and_aggregator(monkeypatch):
    cfg, worker, results = _play("debate", monkeypatch)
    for r in results:
        speakers = [(s, a) for s, a, _ in r.transcript]
        solvers = ["agent_1", "agent_2", "agent_3"]
        assert speakers == [(0, a) for a in solvers] + [(1, a) for a in solvers] + [(2, "agent_4")]
        assert "agent_3" not in r.trajectories  # scripted: no model turns
        assert all(
            text.split("answer: ")[-1].lstrip("-").isdigit() for _, a, text in r.transcript if a == "agent_3"
        )
    _train_one(worker, results, "agent_4")


@pytest.mark.timeout(300)
def test_negotiation_example_custom_env_public_api_only(monkeypatch):
    cfg, worker, results = _play("negotiation", monkeypatch)
    src = (ROOT / "examples" / "workflows" / "negotiation" / "negotiation.py").read_text()
    imports = [line.split()[1] for line in src.splitlines() if line.startswith(("import ", "from "))]
    framework = [m for m in imports if m.startswith(("marti", "services"))]
    assert framework and set(framework) <= {"marti.env.make", "marti.team.workflow"}, (
        framework
    )  # public API only
    for r in results:
        speakers = [a for _, a, _ in r.transcript]
        assert speakers[0] == "seller" and all(x != y for x, y in zip(speakers, speakers[1:], strict=False))
        assert 1 <= len(speakers) <= 4
        deal = r.metrics.get("task_completion", 0.0) == 1.0
        assert r.returns["buyer"] == pytest.approx(r.env_returns["buyer"] + (0.2 if deal else 0.0))
    _train_one(worker, results, "buyer")
