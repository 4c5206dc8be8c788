"""A turn's reply start (:class:`marti.team.workflow.TurnPrompt`): a role's prompt builder chooses how one turn's reply
starts; :func:`~services.trainer.rollout.engines.generation.generate_turns` prefills it after the agent's
``response_prefix`` on every engine that runs on a CPU (its ids are prompt ids, the text starts with it, the
log-probabilities cover only the generated tokens), and the episode runner threads it to the engine and hands
the whole reply to the parser and the env.
"""

from __future__ import annotations

import re
import threading
from types import SimpleNamespace
from typing import Any

import gymnasium
import pytest

from marti.config.sections.rollout import VllmConfig
from marti.env.make import ParallelEnv
from marti.errors import InvalidArgumentError
from marti.team.workflow import PromptContext, Role, TurnPrompt, Workflow
from services.trainer.models.loading import build_tiny_model, load_tokenizer
from services.trainer.rollout import AgentModel, HFRolloutEngine, SamplingParams
from services.trainer.rollout.engines.base import chat_to_ids
from services.trainer.rollout.engines.generation import GenerationConfig, generate_turns
from services.trainer.rollout.engines.instant import InstantRolloutEngine
from services.trainer.rollout.engines.static import StaticCacheRolloutEngine
from services.trainer.rollout.episodes.runner import EpisodeRunner

CHAT = [
    {"role": "system", "content": "You are an executor."},
    {"role": "user", "content": "Capacity: 3 tasks."},
]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-llama")


def _engine(kind: str, tok: Any, max_model_len: int = 2048) -> Any:
    if kind == "instant":
        return InstantRolloutEngine({"a": tok}, max_model_len=max_model_len)
    agents = {"a": AgentModel(build_tiny_model(tok, seed=0), tok)}
    return HFRolloutEngine(agents) if kind == "hf" else StaticCacheRolloutEngine(agents, compile=False)


def _cfg(prefix: str = "", max_new_tokens: int = 4) -> GenerationConfig:
    return GenerationConfig(
        engine="hf",
        vllm=VllmConfig(),
        dtype=None,
        sampling={"a": SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)},
        response_prefixes={"a": prefix},
    )


def _ids(tok: Any, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize("kind", ["hf", "hf_static", "instant"])
@pytest.mark.parametrize("prefix", ["", "Answer:"])
def test_two_rows_with_different_reply_starts_are_prefilled_in_one_call(tok, kind, prefix):
    policy = SimpleNamespace(tokenizer=lambda agent: tok)
    starts = [" I can do 3 tasks: task_", " I can do 12 tasks: task_"]
    gens = generate_turns(
        _cfg(prefix), policy, _engine(kind, tok), threading.Lock(), "a", [CHAT, CHAT], False, starts
    )
    for gen, start in zip(gens, starts, strict=True):
        fill = _ids(tok, prefix + start)
        assert gen.prompt_token_ids == chat_to_ids(tok, CHAT) + fill  # prompt ids: never trained
        assert gen.text.startswith(prefix + start)
        assert gen.text == prefix + start + tok.decode(gen.response_token_ids, skip_special_tokens=True)
        assert 0 < len(gen.response_token_ids) == len(gen.response_logprobs) <= 4  # generated tokens only
    assert gens[0].prompt_token_ids != gens[1].prompt_token_ids  # the rows differ at the end of the prompt


@pytest.mark.parametrize("kind", ["hf", "hf_static"])
def test_a_group_whose_rows_differ_at_the_end_of_the_prompt_samples_as_without_prefix_sharing(tok, kind):
    policy = SimpleNamespace(tokenizer=lambda agent: tok)
    model = build_tiny_model(tok, seed=0)
    engine_class = HFRolloutEngine if kind == "hf" else StaticCacheRolloutEngine
    starts = [" task_", " task_", " tasks: task_", " task_"]
    outs = []
    for share in (True, False):
        engine = engine_class({"a": AgentModel(model, tok)}, share_prompt_prefix=share)
        gens = generate_turns(_cfg(), policy, engine, threading.Lock(), "a", [CHAT] * 4, False, starts)
        outs.append([(g.prompt_token_ids, g.response_token_ids, g.text) for g in gens])
        if kind == "hf_static":  # shared: the rows' common head once (cheaper than the 2 distinct prompts)
            assert engine.last_stats["prefill_rows"] == (1 if share else 4)
    assert outs[0] == outs[1] and outs[0][0] == outs[0][1] == outs[0][3] != outs[0][2]


def test_rows_without_a_reply_start_are_the_calls_without_reply_starts(tok):
    policy = SimpleNamespace(tokenizer=lambda agent: tok)
    engine = _engine("hf", tok)
    plain = generate_turns(_cfg("Answer:"), policy, engine, threading.Lock(), "a", [CHAT])
    empty = generate_turns(_cfg("Answer:"), policy, engine, threading.Lock(), "a", [CHAT], False, [""])
    assert (
        plain[0].prompt_token_ids
        == empty[0].prompt_token_ids
        == chat_to_ids(tok, CHAT) + _ids(tok, "Answer:")
    )
    assert plain[0].text == empty[0].text and plain[0].text.startswith("Answer:")


@pytest.mark.parametrize(
    ("starts", "named"),
    [(["x"], r"one str per chat \(2\), got list of length 1"), (["x", 3], r"reply_starts\[1\]")],
)
def test_reply_starts_that_do_not_fit_the_chats_are_refused(tok, starts, named):
    policy = SimpleNamespace(tokenizer=lambda agent: tok)
    with pytest.raises(InvalidArgumentError, match=named):
        generate_turns(
            _cfg(), policy, _engine("instant", tok), threading.Lock(), "a", [CHAT, CHAT], False, starts
        )


def _ctx() -> PromptContext:
    return PromptContext(agent="exec", role="executor", observation="obs", messages=[], step=0, info={})


def test_a_str_builder_is_a_turn_prompt_without_a_reply_start():
    assert Role("exec", build_prompt=lambda ctx: ctx.observation + "!").turn_prompt(_ctx()) == TurnPrompt(
        "obs!"
    )
    assert Role("exec").turn_prompt(_ctx()) == TurnPrompt("obs")  # the default builder
    built = TurnPrompt("u", "r")
    assert Role("exec", build_prompt=lambda ctx: built).turn_prompt(_ctx()) is built


@pytest.mark.parametrize("bad", [None, 3, ["user"], b"bytes"])
def test_a_builder_returning_another_type_is_refused_naming_the_role_and_the_type(bad):
    with pytest.raises(InvalidArgumentError) as err:
        Role("exec", build_prompt=lambda ctx: bad).turn_prompt(_ctx())
    assert "'exec'" in str(err.value) and "'executor'" in str(err.value)
    assert type(bad).__name__ in str(err.value) and "TurnPrompt" in str(err.value)


@pytest.mark.parametrize(("user", "start"), [(3, ""), ("u", None)])
def test_a_turn_prompt_of_non_text_is_refused(user, start):
    with pytest.raises(InvalidArgumentError, match="must be a str"):
        TurnPrompt(user, start)


# ---------------------------------------------------------------------------------------------- the runner
class CapacityEnv(ParallelEnv):
    """One executor told its capacity; one step, whose actions it records; the episode then ends."""

    metadata = {"name": "capacity", "metrics": ()}

    def __init__(self, seed: int | None = None) -> None:
        self.possible_agents = ["a"]
        self.agents: list[str] = []
        self.steps: list[dict[str, str]] = []
        self._space = gymnasium.spaces.Text(256)

    def observation_space(self, agent: str) -> gymnasium.Space:
        return self._space

    def action_space(self, agent: str) -> gymnasium.Space:
        return self._space

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.agents = ["a"]
        return {"a": f"Your capacity is {3 + (seed or 0)} tasks."}, {"a": {"is_acting": True}}

    def step(self, actions: dict[str, str]) -> tuple[dict, dict, dict, dict, dict]:
        self.steps.append(dict(actions))
        self.agents = []
        return {"a": ""}, {"a": 1.0}, {"a": True}, {"a": False}, {"a": {}}


def capacity_prompt(ctx: PromptContext) -> TurnPrompt:
    """The user message, and a reply start naming the capacity read from the observation."""
    n = re.search(r"capacity is (\d+)", ctx.observation)[1]
    return TurnPrompt(ctx.observation, reply_start=f"I can do {n} tasks: task_")


def _runner(envs: list[CapacityEnv], generate: Any, role: Role, parsed: list[str]) -> EpisodeRunner:
    def make_env(seed: int) -> CapacityEnv:
        envs.append(CapacityEnv(seed))
        return envs[-1]

    def parser(text: str) -> str:
        parsed.append(text)
        return text

    return EpisodeRunner(
        make_env=make_env,
        generate=generate,
        comm_factory=None,
        agents=["a"],
        roles={"a": "executor"},
        system_prompts={"a": "You are an executor."},
        policy_version=lambda agent: 0,
        workflow=Workflow.env(
            roles=[Role("a", build_prompt=role.build_prompt, parser=parser, policy=role.policy)]
        ),
    )


def test_an_episode_with_a_reply_start_reaches_the_env_with_the_whole_reply(tok):
    policy = SimpleNamespace(tokenizer=lambda agent: tok)
    engine, calls = _engine("hf", tok), []

    def generate(agent: str, chats: list, *reply_starts: list[str]) -> list[Any]:
        calls.append(reply_starts)
        return generate_turns(
            _cfg("Plan:"), policy, engine, threading.Lock(), agent, chats, False, *reply_starts
        )

    envs: list[CapacityEnv] = []
    parsed: list[str] = []
    results = _runner(envs, generate, Role("a", build_prompt=capacity_prompt), parsed).play([0, 2])
    assert calls == [(["I can do 3 tasks: task_", "I can do 5 tasks: task_"],)]  # one call, a start per row
    for env, result, n in zip(envs, results, (3, 5), strict=True):
        turn, fill = result.trajectories["a"].turns[0], f"Plan:I can do {n} tasks: task_"
        whole = fill + tok.decode(turn.response_token_ids, skip_special_tokens=True)
        assert env.steps == [{"a": whole}] and whole in parsed and result.transcript == [(0, "a", whole)]
        assert turn.response_text == whole and turn.prompt_token_ids[-len(_ids(tok, fill)) :] == _ids(
            tok, fill
        )
        assert len(turn.response_logprobs) == len(turn.response_token_ids) > 0


def test_a_str_builder_calls_generate_as_before():
    calls: list[tuple] = []

    def generate(agent: str, chats: list) -> list[Any]:  # no third argument: the runner passes none
        calls.append((agent, chats))
        return [
            SimpleNamespace(
                text="done", prompt_token_ids=[1], response_token_ids=[2], response_logprobs=[0.0]
            )
        ]

    envs: list[CapacityEnv] = []
    _runner(envs, generate, Role("a", build_prompt=lambda ctx: ctx.observation.upper()), []).play([0])
    assert calls[0][1][0][1] == {"role": "user", "content": "YOUR CAPACITY IS 3 TASKS."}
    assert envs[0].steps == [{"a": "done"}]


def test_a_scripted_agents_answer_continues_its_reply_start():
    envs: list[CapacityEnv] = []
    role = Role("a", build_prompt=capacity_prompt, policy=lambda chat: "1, task_2")
    _runner(envs, None, role, []).play([0])
    assert envs[0].steps == [{"a": "I can do 3 tasks: task_1, task_2"}]


def test_a_reply_start_that_makes_the_prompt_too_long_is_refused_named(tok):
    policy = SimpleNamespace(tokenizer=lambda agent: tok)
    chat_len = len(
        chat_to_ids(
            tok,
            [
                {"role": "system", "content": "You are an executor."},
                {"role": "user", "content": "Your capacity is 3 tasks."},
            ],
        )
    )
    engine = _engine("instant", tok, max_model_len=chat_len + 4 + 2)  # room for 2 prefilled tokens

    def generate(agent: str, chats: list, *reply_starts: list[str]) -> list[Any]:
        return generate_turns(_cfg(), policy, engine, threading.Lock(), agent, chats, False, *reply_starts)

    with pytest.raises(InvalidArgumentError) as err:
        _runner([], generate, Role("a", build_prompt=capacity_prompt), []).play([0])
    message = str(err.value)
    assert (
        "problem seed 0, agent 'a', turn 0" in message and "reply start 'I can do 3 tasks: task_'" in message
    )
    assert "exceeds max_model_len" in message


# ---------------------------------------------------------------------------------------------- the actors
@pytest.mark.parametrize("actor", ["policy_worker_ema", "rollout_worker"])
def test_the_sampling_actors_prefill_each_rows_reply_start(actor):
    from pathlib import Path

    from marti.config import load_config
    from services.trainer.ray.policy_worker import PolicyWorker, policy_actor_config
    from services.trainer.ray.rollout_worker import RolloutWorker, rollout_actor_config

    root = Path(__file__).resolve().parents[4]
    overrides = ["rollout.max_new_tokens=4", "agents.0.response_prefix=Plan", "policy.ema=true"]
    cfg = load_config(root / "examples" / "tiny.yaml", overrides)
    if actor == "rollout_worker":
        worker: Any = RolloutWorker(rollout_actor_config(cfg), index=0, num_threads=1)
    else:  # greedy turns of a trained agent with policy.ema: sampled with the averages
        worker = PolicyWorker(policy_actor_config(cfg), num_threads=1)
        assert "agent_1" in worker.policy.trainable_agents and worker.ema
    tok = worker.policy.tokenizer("agent_1")
    starts = [" I can do 3 tasks: task_", ""]
    gens = worker.generate("agent_1", [CHAT, CHAT], True, starts)
    for gen, start in zip(gens, starts, strict=True):
        assert gen.text.startswith("Plan" + start)
        assert gen.prompt_token_ids == chat_to_ids(tok, CHAT) + _ids(tok, "Plan" + start)
        assert len(gen.response_logprobs) == len(gen.response_token_ids) > 0
