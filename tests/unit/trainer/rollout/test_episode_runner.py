"""The episode runner's single turn loop: the default (env-driven) path is byte-identical to the runner that had
two turn loops, env-declared metrics, the ``on_episode_end`` hook, and lockstep envs stepped by ``BatchStep``.

The golden digests below were recorded with the runner of commit 6cd7d2c (two turn loops, ``_turn`` for the
env-driven default), playing :class:`RelayEnv` with :func:`fake_generate` and the in-memory :class:`FakeBroker`;
``record`` names everything compared: every generate call (agent, chat prompts), every action dict an env was
stepped with, and per episode its trajectories (every turn field), returns, env returns and metrics.
"""

from __future__ import annotations

import hashlib
import json
import random
import zlib
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import gymnasium
import pytest

from marti.env.make import ParallelEnv, declared_metrics, step_many
from marti.errors import InvalidArgumentError
from marti.team.workflow import Role, Workflow
from services.trainer.rollout.episodes.runner import EpisodeRunner

AGENTS = ["a0", "a1", "a2"]
#: Speakers per turn: one, two at once, one, two at once (then the env truncates).
SCHEDULE = (["a0"], ["a1", "a2"], ["a2"], ["a0", "a1"])


class RelayEnv(ParallelEnv):
    """A small deterministic text env: agents guess a hidden digit; a right guess ends the episode.

    Acting agents get +1 for a readable ``guess: N`` and -0.5 (``parse_error``) otherwise; every agent gets 0.1
    per step; the episode is truncated after ``len(SCHEDULE)`` turns.
    """

    metadata = {"name": "relay", "metrics": ("task_completion", "team_score")}

    def __init__(self, seed: int | None = None) -> None:
        self.possible_agents = list(AGENTS)
        self.agents: list[str] = []
        self._seed = seed
        self._space = gymnasium.spaces.Text(256)
        self.steps: list[dict[str, str]] = []

    def observation_space(self, agent: str) -> gymnasium.Space:
        return self._space

    def action_space(self, agent: str) -> gymnasium.Space:
        return self._space

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        rng = random.Random(self._seed if seed is None else seed)
        self.target = rng.randint(1, 9)
        self.turn, self.score, self.solved, self.last = 0, 0.0, False, ""
        self.agents = list(AGENTS)
        return self._obs(), self._infos({})

    def _acting(self) -> list[str]:
        return SCHEDULE[self.turn] if self.turn < len(SCHEDULE) else []

    def _obs(self) -> dict[str, str]:
        return {
            a: f"{a}: turn {self.turn}, hint {self.target % 3}, last {self.last!r}, "
            + ("your turn" if a in self._acting() else "wait")
            for a in AGENTS
        }

    def _infos(self, bad: dict[str, bool]) -> dict[str, dict[str, Any]]:
        acting = self._acting()
        return {
            a: {
                "is_acting": a in acting,
                "parse_error": bad.get(a, False),
                "task_completion": float(self.solved),
                "team_score": self.score,
                "turn": self.turn,
                "hidden": "not a metric",
            }
            for a in AGENTS
        }

    def step(self, actions: dict[str, str]) -> tuple[dict, dict, dict, dict, dict]:
        self.steps.append(dict(actions))
        rewards = dict.fromkeys(AGENTS, 0.1)
        bad = {}
        for a in self._acting():
            text = actions.get(a, "")
            if text.startswith("guess: ") and text[7:].isdigit():
                rewards[a] += 1.0
                self.solved = self.solved or int(text[7:]) == self.target
            else:
                rewards[a] -= 0.5
                bad[a] = True
            self.last = text
        self.score += sum(rewards.values())
        self.turn += 1
        done, cut = self.solved, not self.solved and self.turn >= len(SCHEDULE)
        live = list(self.agents)
        if done or cut:
            self.agents = []
        obs, infos = self._obs(), self._infos(bad)
        return obs, rewards, dict.fromkeys(live, done), dict.fromkeys(live, cut), infos


@dataclass
class _Gen:
    text: str
    prompt_token_ids: list[int]
    response_token_ids: list[int]
    response_logprobs: list[float]
    policy_version: int = 3


def fake_generate(calls: list) -> Any:
    """A deterministic ``generate``: each reply depends on the whole prompt (so prompts steer actions)."""

    def generate(agent: str, chats: list[list[dict[str, str]]]) -> list[_Gen]:
        calls.append([agent, chats])
        out = []
        for chat in chats:
            h = zlib.crc32(json.dumps(chat).encode())
            text = f"guess: {h % 9 + 1}" if h % 5 else "no idea"
            out.append(
                _Gen(text, [len(c["content"]) for c in chat], list(text.encode()[:4]), [-0.25, -h % 7 / 8])
            )
        return out

    return generate


@dataclass
class _Msg:
    sender: str
    content: Any


@dataclass
class FakeBroker:
    """In-memory comm_broker: per session and receiver, the messages not read yet."""

    boxes: dict[tuple[str, str], list[_Msg]] = field(default_factory=dict)
    states: list[tuple[str, str, dict]] = field(default_factory=list)

    def client(self, agent: str, session: str) -> Any:
        broker = self

        class Client:
            def send_message(self, receiver: str, content: Any) -> None:
                broker.boxes.setdefault((session, receiver), []).append(_Msg(agent, content))

            def get_messages(self) -> list[_Msg]:
                return broker.boxes.pop((session, agent), [])

            def broadcast_state(self, state: dict) -> None:
                broker.states.append((session, agent, state))

            def flush(self) -> None:
                pass

            def close(self) -> None:
                pass

        return Client()


def _runner(envs: list, calls: list, comm: Any, **kwargs: Any) -> EpisodeRunner:
    def make_env(seed: int) -> RelayEnv:
        envs.append(RelayEnv(seed))
        return envs[-1]

    return EpisodeRunner(
        make_env=make_env,
        generate=fake_generate(calls),
        comm_factory=comm,
        agents=AGENTS,
        roles={"a0": "planner", "a1": "executor", "a2": "evaluator"},
        system_prompts={a: f"You are {a}." for a in AGENTS},
        policy_version=lambda a: 2,
        run_id="golden",
        **kwargs,
    )


def record(results: list, calls: list, envs: list) -> dict[str, Any]:
    """Everything the default path must keep byte-identical (episode ids are random and left out)."""
    return {
        "generate": calls,
        "actions": [e.steps for e in envs],
        "episodes": [
            {
                "seed": r.seed,
                "trajectories": {
                    a: {
                        "agent_id": t.agent_id,
                        "role": t.role,
                        "policy_version": t.policy_version,
                        "metadata": t.metadata,
                        "turns": [
                            [
                                u.step,
                                u.prompt_token_ids,
                                u.response_token_ids,
                                u.response_logprobs,
                                u.reward,
                                u.terminated,
                                u.truncated,
                                u.info,
                                u.response_text,
                            ]
                            for u in t.turns
                        ],
                    }
                    for a, t in r.trajectories.items()
                },
                "returns": r.returns,
                "env_returns": r.env_returns,
                "metrics": r.metrics,
            }
            for r in results
        ],
    }


def _digest(rec: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(rec).encode()).hexdigest()


SEEDS = [3, 3, 5, 9, 13, 21]
GOLDEN = {  # recorded with the two-loop runner (commit 6cd7d2c) on the same record
    "broker": "0e79f2a1e0d98b6af834c39c9d7a89626b3eec3e70ed790acd77c7aeee913de9",
    "no_broker": "2cee0540d23c54fac7d89c9f0d368436c03034f1503a84fbe0e95b4af18c45e4",
}


@pytest.mark.parametrize("mode", ["broker", "no_broker"])
def test_default_path_is_byte_identical_to_the_two_loop_runner(mode, tmp_path):
    envs, calls = [], []
    comm = FakeBroker().client if mode == "broker" else None
    results = _runner(envs, calls, comm).play(SEEDS)
    rec = record(results, calls, envs)
    (tmp_path / "record.json").write_text(json.dumps(rec, indent=1))  # to diff by hand on a failure
    assert _digest(rec) == GOLDEN[mode], f"record in {tmp_path / 'record.json'}"
    # The golden covers what matters: episodes end at different turns, speakers act alone and together.
    assert len({r.metrics["num_turns"] for r in results}) > 1
    assert {r.metrics["task_completion"] for r in results} == {0.0, 1.0}
    assert any(r.metrics["format_valid"] < 1.0 for r in results)
    if mode == "broker":
        assert any(
            "Messages from your teammates:" in chat[1]["content"] for _, chats in calls for chat in chats
        )
    else:
        assert not any("teammates" in chat[1]["content"] for _, chats in calls for chat in chats)


def test_default_path_equals_the_explicit_env_workflow():
    """``workflow=None`` and an explicit ``Workflow.env()`` play the same episodes (with a broker)."""
    recs = []
    for wf in (None, Workflow.env()):
        envs, calls = [], []
        results = _runner(envs, calls, FakeBroker().client, workflow=wf).play(SEEDS)
        recs.append(_digest(record(results, calls, envs)))
    assert recs[0] == recs[1]


def test_metrics_are_the_env_declared_ones_plus_the_runner_counters():
    results = _runner([], [], None).play([4])
    assert list(results[0].metrics) == [
        "task_completion",
        "team_score",
        "num_turns",
        "format_valid",
        "messages",
    ]
    assert "hidden" not in results[0].metrics and "turn" not in results[0].metrics

    class Undeclared(RelayEnv):
        metadata = {"name": "relay"}

    runner = _runner([], [], None)
    runner.make_env = lambda seed: Undeclared(seed)
    (res,) = runner.play([4])
    assert list(res.metrics) == ["num_turns", "format_valid", "messages"]


def test_a_bad_metrics_declaration_is_named_and_closes_the_env():
    class Bad(RelayEnv):
        metadata = {"name": "relay", "metrics": "task_completion"}

    closed = []
    bad = Bad(1)
    bad.close = lambda: closed.append(True)
    runner = _runner([], [], None)
    runner.make_env = lambda seed: bad
    with pytest.raises(InvalidArgumentError, match="Bad.metadata\\['metrics'\\]"):
        runner.play([1])
    assert closed
    assert declared_metrics(SimpleNamespace()) == ()
    assert declared_metrics(SimpleNamespace(metadata={"metrics": ["x"]})) == ("x",)


def test_on_episode_end_gets_each_final_result_once_as_it_ends():
    envs: list = []
    seen: list[tuple[Any, int]] = []
    runner = _runner(envs, [], FakeBroker().client)
    now = {"step": -1}
    real_turn = runner._turn

    def turn(lives, step):
        now["step"] = step
        real_turn(lives, step)

    runner._turn = turn

    def hook(result):
        assert result.metrics and result.env_returns  # the final result: metrics and returns are set
        seen.append((result, now["step"]))

    runner.on_episode_end = hook
    results = runner.play(SEEDS)
    assert [r.seed for r in results] == SEEDS  # play still returns them in seed order
    assert sorted(map(id, results)) == sorted(id(r) for r, _ in seen)  # each episode once
    index = {id(r): i for i, r in enumerate(results)}
    ends = [(step, index[id(r)]) for r, step in seen]
    for step, i in ends:  # right after the turn in which its env ended
        assert envs[i].turn - 1 == step and not envs[i].agents
    assert ends == sorted(ends)  # by turn, then in the order of the seeds
    assert len({step for step, _ in ends}) > 1  # episodes did end at different turns


def test_on_episode_end_sees_the_workflow_rewards_and_cut_episodes():
    """With a reward_fn the hook gets the re-credited returns; episodes cut by max_turns are handed over too."""
    seen = []
    wf = Workflow.env(reward_fn=lambda ep: dict.fromkeys(ep.agents, 10.0))
    runner = _runner([], [], None, workflow=wf, on_episode_end=lambda r: seen.append(r))
    results = runner.play([4, 7], max_turns=1)
    assert seen == results  # both cut after one turn, handed over in seed order
    for r in results:
        assert r.returns == pytest.approx({a: r.env_returns[a] + 10.0 for a in AGENTS})


def test_a_failing_hook_stops_play_and_closes_every_env():
    envs: list = []
    closed = []

    def boom(result):
        raise RuntimeError("store down")

    runner = _runner(envs, [], None, on_episode_end=boom)
    real = runner.make_env

    def make_env(seed):
        env = real(seed)
        env.close = lambda: closed.append(seed)
        return env

    runner.make_env = make_env
    with pytest.raises(RuntimeError, match="store down"):
        runner.play([4, 7])
    assert sorted(closed) == [4, 7]


def test_workflow_scripted_agents_parsers_and_transcript_share_the_one_loop():
    calls: list = []
    wf = Workflow(
        lambda s: ["a0", "a1"] if s.step % 2 == 0 else ["a2"],
        roles=[Role("a1", policy=lambda chat: "guess: 5"), Role("a2", parser=lambda t: "guess: 1")],
    )
    envs: list = []
    (res,) = _runner(envs, calls, None, workflow=wf).play([4], max_turns=2)
    assert [(s, a) for s, a, _ in res.transcript] == [(0, "a0"), (0, "a1"), (1, "a2")]
    assert "a1" not in res.trajectories  # scripted: no trainable turns
    assert envs[0].steps[0]["a1"] == "guess: 5" and envs[0].steps[1]["a2"] == "guess: 1"
    # a workflow without a broker delivers replies through the local mailbox
    assert "[a0]: " in calls[-1][1][0][1]["content"] and "[a1]: guess: 5" in calls[-1][1][0][1]["content"]


# ---------------------------------------------------------------------------------------------- step_many
class _Counting(RelayEnv):
    def __init__(self, seed):
        super().__init__(seed)
        self.calls = 0

    def step(self, actions):
        self.calls += 1
        return super().step(actions)


def test_step_many_steps_local_envs_one_by_one_and_checks_lengths():
    envs = [_Counting(s) for s in (1, 2)]
    for e in envs:
        e.reset()
    out = step_many(envs, [{"a0": "guess: 1"}, {"a0": "x"}])
    assert [e.calls for e in envs] == [1, 1]
    assert out[0][1]["a0"] == pytest.approx(1.1) and out[1][4]["a0"]["parse_error"]
    with pytest.raises(ValueError, match="1 action dicts for 2 envs"):
        step_many(envs, [{}])


def test_a_reward_fn_key_that_is_not_an_agent_stops_play_naming_it():
    """A "judge" key is not credited as an extra agent: the episode's end is refused naming it and the team."""
    seen = []
    wf = Workflow.env(reward_fn=lambda ep: {"judge": 100.0})
    runner = _runner([], [], None, workflow=wf, on_episode_end=lambda r: seen.append(r))
    with pytest.raises(InvalidArgumentError, match=r"\['judge'\].*agents are"):
        runner.play([4], max_turns=1)
    assert seen == []
