"""The ``dataset_task`` env in-process: rows, turns, team and own rewards, metrics, and bad config."""

from __future__ import annotations

from typing import Any

import pytest

import marti
from marti.env.registry import default_registry, describe_spec
from marti.errors import InvalidArgumentError

PROBLEM = "求 $\\frac{1}{2} + \\frac{1}{4}$ 的值。答案写成小数。"
ROW = {"prompt": PROBLEM, "label": "0.75", "hint": "½ + ¼ = ¾", "source": "测试"}
REASONING = "先通分：$\\frac{2}{4} + \\frac{1}{4} = \\frac{3}{4}$。\n"


def make(**config: Any) -> Any:
    return marti.make("dataset_task", **{"row": ROW, "verifier": "math", **config})


def play(env: Any, *turns: dict[str, str]) -> tuple[dict, dict, dict, dict, dict]:
    env.reset(seed=0)
    out = None
    for actions in turns:
        out = env.step(actions)
    assert out is not None
    return out


def test_one_solver_episode_scores_its_boxed_latex_answer() -> None:
    env = make()
    obs, infos = env.reset(seed=0)
    assert obs == {"agent_1": PROBLEM}
    assert infos["agent_1"]["is_acting"] is True
    assert env.observation_space("agent_1").contains(PROBLEM)
    _, rewards, terms, truncs, infos = env.step({"agent_1": REASONING + "\\boxed{0.75}"})
    assert rewards == {"agent_1": 1.0}
    assert terms == {"agent_1": True} and truncs == {"agent_1": False}
    assert env.agents == []
    info = infos["agent_1"]
    assert (info["answer"], info["correct"], info["task_completion"], info["accuracy/agent_1"]) == (
        "0.75",
        True,
        1.0,
        1.0,
    )


def test_debate_rewards_mix_team_and_own_correctness() -> None:
    env = make(agents=["alice", "bob", "judge"], max_turns=3, own_weight=0.25)
    _, rewards, terms, _, infos = play(
        env,
        {"alice": "答案是 3/4", "bob": "Answer: 0.5"},
        {"alice": "Answer: 0.75", "bob": "I keep \\boxed{\\frac{1}{2}}"},
        {"judge": "Alice is right: \\boxed{\\frac{3}{4}}"},
    )
    # judge spoke last: its answer is the team's (correct); bob was wrong; alice right.
    assert rewards == {"alice": 1.0, "bob": 0.75, "judge": 1.0}
    assert all(terms.values())
    assert infos["bob"]["answer"] == "\\frac{1}{2}" and infos["bob"]["correct"] is False
    assert infos["alice"]["team_answer"] == "\\frac{3}{4}"
    assert {k: v for k, v in infos["alice"].items() if k.startswith("accuracy/")} == {
        "accuracy/alice": 1.0,
        "accuracy/bob": 0.0,
        "accuracy/judge": 1.0,
    }
    assert env.unwrapped.metadata["metrics"] == (
        "task_completion",
        "accuracy/alice",
        "accuracy/bob",
        "accuracy/judge",
    )


def test_rewards_come_only_at_the_end_and_silent_agents_get_the_team_reward() -> None:
    env = make(num_agents=2, max_turns=2, final_agent="agent_2")
    env.reset(seed=0)
    _, rewards, terms, _, infos = env.step({"agent_1": "\\boxed{0.75}", "agent_2": ""})
    assert rewards == {"agent_1": 0.0, "agent_2": 0.0} and not any(terms.values())
    assert infos["agent_2"]["is_acting"] is True
    _, rewards, _, _, infos = env.step({"agent_2": "\\boxed{0.7}"})
    assert rewards == {"agent_1": 0.5, "agent_2": 0.0}  # team wrong: final_agent agent_2 answered 0.7
    env.reset(seed=0)
    env.step({"agent_1": "\\boxed{0.75}"})
    _, rewards, _, _, infos = env.step({})
    assert infos["agent_2"]["spoke"] is False
    assert rewards == {"agent_1": 0.5, "agent_2": 0.0}  # final_agent never answered: the team has no answer


def test_majority_vote_over_the_agents_last_answers() -> None:
    env = make(num_agents=3, final="majority", verifier="numeric")
    actions = {"agent_1": "Answer: 0.75", "agent_2": "Answer: 0.7", "agent_3": "so \\boxed{0.75}"}
    _, rewards, _, _, infos = play(env, actions)
    assert infos["agent_1"]["task_completion"] == 1.0
    assert rewards == {"agent_1": 1.0, "agent_2": 0.5, "agent_3": 1.0}
    _, _, _, _, infos = play(env, {"agent_1": "0.75", "agent_2": "Answer: 0.7", "agent_3": "Answer: 0.7"})
    assert infos["agent_1"]["task_completion"] == 0.0 and infos["agent_1"]["team_answer"] == "0.7"


def test_agent_inputs_split_the_row_between_agents() -> None:
    env = make(num_agents=2, agent_inputs={"agent_2": "hint"})
    obs, _ = env.reset(seed=0)
    assert obs == {"agent_1": PROBLEM, "agent_2": "½ + ¼ = ¾"}


def test_rows_are_picked_by_seed_and_in_turn_without_one() -> None:
    rows = [{"prompt": f"问题 {i}", "label": str(i)} for i in range(3)]
    env = marti.make("dataset_task", rows=rows, seed=1)
    assert [env.reset()[0]["agent_1"] for _ in range(4)] == ["问题 1", "问题 2", "问题 0", "问题 1"]
    assert env.reset(seed=5)[0]["agent_1"] == "问题 2"
    space = env.observation_space("agent_1")
    assert all(space.contains(r["prompt"]) for r in rows)


def test_exact_verifier_on_unicode_labels_and_numeric_labels() -> None:
    env = marti.make("dataset_task", row={"prompt": "法国的首都？", "label": "巴黎"})
    assert play(env, {"agent_1": "想一想……\n答案：巴黎。"})[1] == {"agent_1": 1.0}
    env = marti.make(
        "dataset_task", row={"question": "6*7", "answer": 42}, input_key="question", label_key="answer"
    )
    assert play(env, {"agent_1": "Answer: 42"})[1] == {"agent_1": 1.0}


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"row": None}, "needs config key 'row'"),
        ({"row": None, "rows": []}, "'rows' is empty"),
        ({"row": None, "rows": [ROW, "x"]}, "rows\\[1\\] must be a dict"),
        (
            {"row": {"question": "q", "label": "1"}},
            "row has no input column 'prompt' .its columns: label, question",
        ),
        ({"row": {"prompt": "q"}}, "row has no label column 'label'"),
        ({"row": {"prompt": "", "label": "1"}}, "column 'prompt' must be non-empty text"),
        ({"row": {"prompt": "q", "label": [1]}}, "label column 'label' must be text or a number"),
        (
            {"row": None, "rows": [ROW, {"prompt": "q", "label": "x"}], "verifier": "numeric"},
            "rows\\[1\\]: numeric verifier: label 'x'",
        ),
        ({"verifier": "fuzzy"}, "'verifier' must be one of"),
        ({"verifier": "exact", "tolerance": 0.1}, "verifier 'exact' takes no option 'tolerance'"),
        ({"verifier": "regex"}, "verifier 'regex' needs the option 'pattern'"),
        ({"final_agent": "boss"}, "final_agent 'boss' is not in the team"),
        ({"final_agent": "agent_1", "final": "majority"}, "final: majority takes no final_agent"),
        ({"agent_inputs": {"agent_7": "hint"}}, "agent_inputs names agent 'agent_7'"),
        ({"agent_inputs": {"agent_1": "nope"}}, "row has no input column 'nope'"),
        ({"agents": ["a", "a"]}, "'agents' must be distinct"),
        ({"agents": ["a", "b"], "num_agents": 3}, "num_agents=3 but agents"),
        ({"row": ROW, "rows": [ROW]}, "not both"),
    ],
)
def test_bad_config_is_refused_naming_the_key_row_and_column(config: dict, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        make(**config)


def test_registered_by_entry_point_and_described() -> None:
    spec = default_registry().resolve("dataset_task")
    assert spec.env_id == "dataset_task-v1"
    described = describe_spec(spec)
    assert described["agents"] == ["agent_1"]
    assert described["metrics"] == ["task_completion", "accuracy/agent_1"]
    assert {f["name"] for f in described["config_schema"]} >= {
        "row",
        "rows",
        "verifier",
        "own_weight",
        "final",
    }
