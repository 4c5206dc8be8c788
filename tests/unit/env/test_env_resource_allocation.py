"""The resource_allocation scenario: turns, observations, rewards (hand-computed), infos and config errors."""

from __future__ import annotations

import json

import pytest

import marti.env.make as me
from marti.errors import InvalidArgumentError
from services.env_server.envs import allocation_problem as ap

ENV = "collaborative_task_solving"


def alloc_text(alloc: dict[str, int]) -> str:
    return "\n".join(f"{k}: {v}" for k, v in alloc.items())


def make(**cfg):
    env = me.make(ENV, seed=5, **cfg)
    env.reset(seed=11)
    return env


def inner(env):
    return env.env


def test_observation_is_self_contained_prompt_and_turn_order() -> None:
    env = make()
    obs, infos = env.reset(seed=11)
    assert env.possible_agents == ["agent_1", "agent_2", "agent_3"]
    assert [infos[a]["role"] for a in env.agents] == ["leader", "executor", "evaluator"]
    assert infos["agent_1"]["is_acting"] and not infos["agent_2"]["is_acting"]
    assert env.acting_agents == ["agent_1"]
    text = obs["agent_1"]
    assert "LEADER" in text and "task_1" in text and "capacity" in text and "It is your turn" in text
    assert "reply with an empty message" in obs["agent_2"]
    for a in env.agents:
        assert env.observation_space(a).contains(obs[a])
    env.step({"agent_1": "task_1: 1", "agent_2": "", "agent_3": ""})
    assert env.acting_agents == ["agent_2"]
    obs, *_ = env.step({"agent_2": "task_1: 1"})
    assert "[agent_1 (leader)]: task_1: 1" in obs["agent_3"]
    assert "agent_2's allocation has total value" in obs["agent_3"]
    assert env.acting_agents == ["agent_3"]


def test_optimal_team_gets_full_team_reward_and_metrics() -> None:
    env = make()
    problem = inner(env).problem
    opt_value, opt = ap.solve(problem)
    plan = alloc_text(opt)
    _, r1, *_ = env.step({"agent_1": plan})
    # dense: leader's plan quality 1.0 * role_weight 0.5; team score unchanged yet
    assert r1 == {"agent_1": 0.5, "agent_2": 0.0, "agent_3": 0.0}
    _, r2, _, _, info = env.step({"agent_2": plan})
    # team score 0 -> 1.0 for everyone; executor role term 1.0 (valid, faithful) * 0.5
    assert r2 == {"agent_1": 1.0, "agent_2": 1.5, "agent_3": 1.0}
    i = info["agent_1"]
    assert i["task_completion"] is True and i["constraint_violations"] == 0
    assert i["optimal_value"] == float(opt_value) and i["allocated_value"] == float(opt_value)
    used = ap.score(problem, opt).used
    expected_util = sum(min(used[r] / c, 1.0) for r, c in problem.capacities.items()) / len(
        problem.capacities
    )
    assert i["resource_utilization"] == pytest.approx(expected_util)
    _, r3, term, trunc, _ = env.step({"agent_3": "score: 0.9 accept"})
    # evaluator accuracy 1 - |0.9 - 1.0| = 0.9, times 0.5
    assert r3 == {"agent_1": 0.0, "agent_2": 0.0, "agent_3": pytest.approx(0.45)}
    assert all(term.values()) and not any(trunc.values()) and env.agents == []


def test_invalid_allocation_penalised_and_unparseable_gets_feedback() -> None:
    env = make(violation_penalty=0.25, max_violation_penalty=10.0, parse_penalty=0.5)
    problem = inner(env).problem
    over = {t.name: t.max_units + 1 for t in problem.tasks}
    env.step({"agent_1": "I have no plan"})
    obs, r, *_ = env.step({"agent_2": alloc_text(over)})
    n_viol = len(ap.score(problem, over).violations)
    assert n_viol >= 3
    team = -0.25 * n_viol
    assert r["agent_1"] == pytest.approx(team) and r["agent_2"] == pytest.approx(team + 0.5 * 0.0)
    assert "INVALID" in obs["agent_3"]
    env.step({"agent_3": "score: 0 revise"})
    obs, r, _, _, infos = env.step({"agent_1": "\x00garbage"})
    assert r["agent_1"] == pytest.approx(-0.25)  # parse penalty 0.5 * role weight
    assert "could not be read" in infos["agent_1"]["parse_error"]
    assert "could not be read" in obs["agent_2"]


def test_sparse_rewards_arrive_at_the_end() -> None:
    env = make(reward_type="sparse", max_turns=3)
    _, opt = ap.solve(inner(env).problem)
    _, r1, *_ = env.step({"agent_1": alloc_text(opt)})
    _, r2, *_ = env.step({"agent_2": alloc_text(opt)})
    assert set(r1.values()) == {0.0} and set(r2.values()) == {0.0}
    _, r3, term, trunc, _ = env.step({"agent_3": "score: 0.5 revise"})
    assert all(trunc.values()) and not any(term.values())
    assert r3 == {"agent_1": 1.5, "agent_2": 1.5, "agent_3": pytest.approx(1.0 + 0.5 * 0.5)}


def test_max_turns_edge_truncates_exactly() -> None:
    env = make(max_turns=4)
    for i, a in enumerate(["agent_1", "agent_2", "agent_3", "agent_1"]):
        _, _, term, trunc, _ = env.step({a: "task_1: 0"})
        assert all(trunc.values()) == (i == 3)
    assert env.agents == []


def test_completion_threshold_edge() -> None:
    env = make(num_agents=1, completion_threshold=1.0)
    assert env.possible_agents == ["agent_1"] and env.acting_agents == ["agent_1"]
    problem = inner(env).problem
    _, opt = ap.solve(problem)
    # a valid allocation one unit short of the optimum on some task is not "completed" at threshold 1.0
    short = dict(opt)
    k = next(n for n, v in opt.items() if v > 0)
    short[k] -= 1
    _, _, term, _, info = env.step({"agent_1": alloc_text(short)})
    assert term["agent_1"] and info["agent_1"]["valid_allocation"] and not info["agent_1"]["task_completion"]
    env.reset(seed=11)
    _, _, _, _, info = env.step({"agent_1": alloc_text(opt)})
    assert info["agent_1"]["task_completion"]


def test_two_agents_end_on_valid_submission() -> None:
    env = make(num_agents=2)
    assert [env.env.role_of[a] for a in env.possible_agents] == ["leader", "executor"]
    env.step({"agent_1": "task_1: 0"})
    _, _, term, _, _ = env.step({"agent_2": "task_1: 0"})
    assert all(term.values())


def test_json_observation_format() -> None:
    env = make(observation_format="json", difficulty="medium")
    obs, _ = env.reset(seed=3)
    doc = json.loads(obs["agent_2"])
    assert doc["role"] == "executor" and len(doc["problem"]["tasks"]) == 5 and doc["your_turn"] is False
    obs, *_ = env.step({"agent_1": "task_2: 1 \u2603"})
    doc = json.loads(obs["agent_2"])
    assert doc["history"][0]["text"] == "task_2: 1 ?" and doc["your_turn"] is True


def test_seeded_trajectories_repeat() -> None:
    def run(seed):
        env = me.make(ENV, seed=seed, difficulty="hard")
        out = [env.reset()]
        for text in ["task_1: 1", "task_2: 2", "score: 0.3"]:
            out.append(env.step({env.acting_agents[0]: text}))
        return out

    assert run(9) == run(9)
    assert run(9)[0] != run(10)[0]


def test_observation_limits_hold() -> None:
    env = make(max_observation_chars=600, max_quote_chars=40)
    long_text = "task_1: 1 " + "x" * 3000
    obs, *_ = env.step({"agent_1": long_text})
    for a in env.possible_agents:
        assert len(obs[a]) <= 600 and env.observation_space(a).contains(obs[a])


@pytest.mark.parametrize(
    ("cfg", "needle"),
    [
        ({"bogus_key": 1}, "'bogus_key'"),
        ({"reward_type": "shaped"}, "'reward_type'"),
        ({"max_turns": 0}, "'max_turns' must be >= 1"),
        ({"num_agents": 4}, "num_agents=4"),
        ({"roles": ["leader", "poet", "evaluator"]}, "'poet'"),
        ({"roles": ["leader", "leader"]}, "roles"),
        ({"debate_rounds": 3}, "'debate_rounds' belongs to scenario 'debate'"),
        ({"max_turns": "ten"}, "'max_turns' must be of type int"),
    ],
)
def test_bad_config_names_the_key(cfg: dict, needle: str) -> None:
    with pytest.raises(InvalidArgumentError) as e:
        me.make(ENV, **cfg)
    assert needle in str(e.value)


def test_planner_alias_and_custom_roles() -> None:
    env = me.make(ENV, roles=["executor", "planner"])
    env.reset(seed=0)
    assert env.env.role_of == {"agent_1": "executor", "agent_2": "leader"}
    assert env.acting_agents == ["agent_2"]


def test_default_rewards_rank_unreadable_below_any_readable_allocation() -> None:
    """Defaults: unreadable (-parse_penalty) < readable with many violations (capped) < fewer violations < valid."""

    def team_after(text: str) -> float:
        env = make()
        env.step({"agent_1": "task_1: 0"})
        _, r, *_ = env.step({"agent_2": text})
        return r["agent_1"]  # the leader's dense reward is the change of the team score alone

    problem = inner(make()).problem
    worst = {t.name: t.max_units + 5 for t in problem.tasks}
    one_over = {t.name: 0 for t in problem.tasks}
    one_over[problem.tasks[0].name] = problem.tasks[0].max_units + 1
    valid = {t.name: 0 for t in problem.tasks}
    valid[problem.tasks[0].name] = 1
    assert ap.score(problem, valid).valid and len(ap.score(problem, worst).violations) >= 5
    unreadable, many, few, ok = (
        team_after("task_1: value 7 per unit"),
        team_after(alloc_text(worst)),
        team_after(alloc_text(one_over)),
        team_after(alloc_text(valid)),
    )
    assert unreadable == pytest.approx(-0.5) and many == pytest.approx(-0.4)
    assert unreadable < many < few < ok


# ---- the evaluator's calibration ----
# make() plays seed 11 on easy: cpu capacity 7, gpu 8; task_1 value 8 uses cpu 3, gpu 4, at most 2 units;
# task_2 value 4 uses cpu 4, gpu 4, at most 1; task_3 value 3 uses cpu 4, gpu 3, at most 1. Optimum: task_1: 2
# (value 16, cpu 6/7, gpu 8/8); "task_2: 1" is valid with value 4, i.e. 4/16 = 0.25 of the optimum.


def test_calibration_problem_is_the_one_the_comments_compute_by_hand() -> None:
    p = inner(make()).problem
    assert p.capacities == {"cpu": 7, "gpu": 8}
    assert [(t.value, t.demand, t.max_units) for t in p.tasks] == [
        (8, {"cpu": 3, "gpu": 4}, 2),
        (4, {"cpu": 4, "gpu": 4}, 1),
        (3, {"cpu": 4, "gpu": 3}, 1),
    ]
    assert inner(make()).optimal_value == 16


@pytest.mark.parametrize(
    ("submission", "evaluation", "error"),
    [
        ("task_2: 1", "score: 0.5 revise", 0.25),  # true fraction 4/16 = 0.25
        ("task_2: 1", "score: 60%", 0.35),
        ("task_1: 2", "score: 0.9 accept", 0.1),  # the optimum: true fraction 1
        ("task_1: 2\ntask_2: 1", "score: 0.75", 0.75),  # invalid (cpu 10/7): true fraction 0
    ],
)
def test_calibration_error_in_every_agents_infos(submission: str, evaluation: str, error: float) -> None:
    env = make()
    _, _, _, _, infos = env.step({"agent_1": "task_1: 0"})
    assert "calibration_error" not in infos["agent_1"]  # no evaluation yet
    env.step({"agent_2": submission})
    _, r, _, _, infos = env.step({"agent_3": evaluation})
    for a in env.possible_agents:  # the trainer reads episode metrics from the first agent's infos
        assert infos[a]["calibration_error"] == pytest.approx(error)
    assert r["agent_3"] == pytest.approx(0.5 * (1.0 - error))  # role weight x (1 - calibration error)
    assert infos["agent_3"]["parse_error"] == ""


def test_calibration_error_is_a_declared_metric() -> None:
    env = make()
    assert "calibration_error" in me.declared_metrics(env)
    assert "calibration_error" in me.declared_metrics(make(scenario="private_allocation"))


@pytest.mark.parametrize(
    "evaluation", ["score: 1.5 accept", "score: 85 accept", "score: -0.1", "score: 120%"]
)
def test_score_outside_0_1_is_a_parse_error_not_clipped(evaluation: str) -> None:
    env = make()
    env.step({"agent_1": "task_1: 2"})
    env.step({"agent_2": "task_1: 2"})  # the optimum: a clipped 1.5 would have been perfectly calibrated
    obs, r, term, _, infos = env.step({"agent_3": evaluation})
    assert r == {
        "agent_1": 0.0,
        "agent_2": 0.0,
        "agent_3": pytest.approx(-0.25),
    }  # parse penalty x role weight
    assert "is outside 0..1" in infos["agent_3"]["parse_error"]
    assert "is outside 0..1" in obs["agent_1"]  # feedback line in the transcript
    assert "calibration_error" not in infos["agent_1"]
    assert not any(term.values()) and env.agents  # an unreadable "accept" does not end the episode


def test_calibration_error_keeps_the_latest_readable_score() -> None:
    env = make()
    env.step({"agent_1": "task_1: 0"})
    env.step({"agent_2": "task_2: 1"})
    env.step({"agent_3": "score: 0.5 revise"})
    env.step({"agent_1": "task_1: 2"})
    _, _, _, _, infos = env.step({"agent_2": "task_1: 2"})
    assert infos["agent_1"]["calibration_error"] == pytest.approx(0.25)  # still the last evaluation's
    _, _, _, _, infos = env.step({"agent_3": "score: 2"})
    assert infos["agent_1"]["calibration_error"] == pytest.approx(0.25) and infos["agent_3"]["parse_error"]
    env.step({"agent_1": "task_1: 2"})
    env.step({"agent_2": "task_1: 2"})
    _, _, _, _, infos = env.step({"agent_3": "score: 0.8 revise"})
    assert infos["agent_1"]["calibration_error"] == pytest.approx(0.2)
    env.reset(seed=11)
    _, _, _, _, infos = env.step({"agent_1": "task_1: 0"})
    assert "calibration_error" not in infos["agent_1"]  # a new episode starts without one


def test_trainer_episode_runner_reports_calibration_error() -> None:
    """The trainer's runner (services.trainer.rollout.episodes.runner) puts the metric in the episode's metrics."""
    from types import SimpleNamespace

    from services.trainer.rollout.episodes.runner import EpisodeRunner

    replies = {"agent_1": "task_1: 2", "agent_2": "task_2: 1", "agent_3": "score: 0.5 revise"}

    def generate(agent, chats):
        return [
            SimpleNamespace(
                text=replies[agent],
                prompt_token_ids=[1],
                response_token_ids=[2],
                response_logprobs=[-0.5],
                policy_version=0,
            )
            for _ in chats
        ]

    agents = ["agent_1", "agent_2", "agent_3"]
    runner = EpisodeRunner(
        make_env=lambda seed: me.make(ENV, seed=seed, max_turns=3),
        generate=generate,
        comm_factory=None,
        agents=agents,
        roles=dict(zip(agents, ["planner", "executor", "evaluator"], strict=True)),
        system_prompts=dict.fromkeys(agents, "You play."),
        policy_version=lambda a: 0,
    )
    (result,) = runner.play([11])
    assert result.metrics["calibration_error"] == pytest.approx(0.25)
