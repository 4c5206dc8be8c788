"""The workflow API, the task scheduler, the curriculum and the priority allocator (pure, no model)."""

from __future__ import annotations

import math
import random
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

import marti
from marti.config import config_from_dict, load_config
from marti.errors import InvalidArgumentError, NotFoundError
from marti.team.workflow import (
    EpisodeView,
    RewardAllocation,
    Role,
    Workflow,
    WorkflowState,
    load_callable,
    make_custom_env,
    workflow_from_section,
)
from services.trainer.learn.allocation import (
    AllocationWeights,
    PriorityAllocator,
    quotas,
    shares_from_priorities,
    take_groups,
)
from services.trainer.rollout.episodes.runner import EpisodeRunner
from services.trainer.rollout.episodes.scheduler import Curriculum, TaskScheduler, TaskSpec

ROOT = Path(__file__).resolve().parents[4]


def _state(step, agents=("a", "b", "c"), acting=(), transcript=()):
    return WorkflowState(step, list(agents), list(acting), {}, {}, list(transcript))


# ---------------------------------------------------------------------------------------------- speakers
def test_chain_cycles_through_order():
    wf = Workflow.chain(["a", "b", "c"])
    assert [wf.speakers(_state(t)) for t in range(5)] == [["a"], ["b"], ["c"], ["a"], ["b"]]


def test_parallel_then_aggregate_alternates():
    wf = Workflow.parallel_then_aggregate(["a", "b"], "c")
    assert [wf.speakers(_state(t)) for t in range(4)] == [["a", "b"], ["c"], ["a", "b"], ["c"]]


def test_debate_rounds_then_aggregator():
    wf = Workflow.debate(["a", "b"], "c", rounds=3)
    assert [wf.speakers(_state(t)) for t in range(5)] == [["a", "b"]] * 3 + [["c"], ["a", "b"]]


def test_env_workflow_and_empty_choice_fall_back_to_is_acting():
    assert Workflow.env().speakers(_state(0, acting=["b"])) == ["b"]
    assert Workflow(lambda s: []).speakers(_state(0, acting=["c"])) == ["c"]


def test_custom_speaker_unknown_agent_is_named():
    wf = Workflow(lambda s: ["zed"], name="mine")
    with pytest.raises(InvalidArgumentError, match="'zed'"):
        wf.speakers(_state(0))


@pytest.mark.parametrize(
    "build",
    [
        lambda: Workflow.chain([]),
        lambda: Workflow.debate(["a"], "c", rounds=0),
        lambda: Workflow.debate(["a", "c"], "c"),
        lambda: Workflow.parallel_then_aggregate([], "c"),
        lambda: Workflow(None, roles=[Role("a"), Role("a")]),
    ],
)
def test_bad_workflows_are_rejected(build):
    with pytest.raises(InvalidArgumentError):
        build()


# ---------------------------------------------------------------------------------------------- rewards
def test_reward_allocation_hand_computed():
    alloc = RewardAllocation(env_weight=1.0, custom_weight=2.0, team_share=0.5)
    out = alloc.apply({"a": 1.0, "b": 0.0}, {"a": 0.0, "b": 1.0})
    # raw a = 1, raw b = 2; mean 1.5; a = 0.5*1 + 0.5*1.5 = 1.25, b = 0.5*2 + 0.75 = 1.75
    assert out == pytest.approx({"a": 1.25, "b": 1.75})
    assert RewardAllocation().apply({"a": 0.3}, None) == {"a": 0.3}


@pytest.mark.parametrize(
    "kwargs", [{"env_weight": -1}, {"env_weight": 0, "custom_weight": 0}, {"team_share": 1.5}]
)
def test_reward_allocation_limits(kwargs):
    with pytest.raises(InvalidArgumentError):
        RewardAllocation(**kwargs)


def test_reward_fn_non_finite_value_is_named():
    wf = Workflow.env(reward_fn=lambda ep: {"a": math.nan})
    view = EpisodeView(["a"], [], {"a": 0.0}, {}, {}, 0)
    with pytest.raises(InvalidArgumentError, match="'a'"):
        wf.rewards(view)
    with pytest.raises(InvalidArgumentError, match="list"):
        Workflow.env(reward_fn=lambda ep: [1.0]).rewards(view)


def test_reward_fn_numpy_scalars_are_rewards_and_tensors_text_and_huge_values_are_named():
    """A reward function computed with numpy returns numpy scalars: they are rewards like floats; a tensor,
    a bool or text is refused naming its type, and a reward beyond the bound as everywhere else."""
    import numpy as np
    import torch

    view = EpisodeView(["a", "b"], [], {"a": 0.0, "b": 0.0}, {}, {}, 0)
    got = Workflow.env(reward_fn=lambda ep: {"a": np.float32(0.5), "b": np.int64(2)}).rewards(view)
    assert got == {"a": 0.5, "b": 2.0} and all(type(v) is float for v in got.values())
    for bad, kind in [(torch.tensor(0.5), "Tensor"), (True, "bool"), ("1", "str")]:
        with pytest.raises(InvalidArgumentError, match=f"agent 'a' the reward .*\\({kind}\\)"):
            Workflow.env(reward_fn=lambda ep, bad=bad: {"a": bad}).rewards(view)
    with pytest.raises(InvalidArgumentError, match="reward_fn's reward for agent 'a'.*1e\\+200"):
        Workflow.env(reward_fn=lambda ep: {"a": 1e200}).rewards(view)


# ---------------------------------------------------------------------------------------------- import paths
def test_load_callable_from_module_and_file(tmp_path):
    assert load_callable("math:sqrt")(9.0) == 3.0
    f = tmp_path / "mine.py"
    f.write_text("def double(x):\n    return 2 * x\nVALUE = 3\n")
    assert load_callable(f"{f}:double")(4) == 8
    with pytest.raises(InvalidArgumentError) as refused:
        load_callable(f"{f}:VALUE")
    assert str(refused.value) == f"import path '{f}:VALUE' names a value of type int, not a callable"
    with pytest.raises(NotFoundError, match="no attribute"):
        load_callable(f"{f}:missing")
    with pytest.raises(NotFoundError, match="does not exist"):
        load_callable(f"{tmp_path}/nope.py:f")
    with pytest.raises(NotFoundError, match="not found"):
        load_callable("no_such_module_xyz:f")
    with pytest.raises(InvalidArgumentError, match="must look like"):
        load_callable("math.sqrt")


def test_custom_env_by_import_path_plays_like_any_env(tmp_path):
    env = make_custom_env(
        f"{ROOT}/examples/workflows/negotiation/negotiation.py:make_env", {"max_turns": 4}, 3
    )
    obs, infos = env.reset(seed=3)
    assert infos["seller"]["is_acting"] and not infos["buyer"]["is_acting"]
    env.step({"seller": "offer: 1000"})
    _, rewards, terms, _, infos = env.step({"buyer": "accept"})
    assert all(terms.values()) and infos["buyer"]["deal"]
    span = env.value - env.cost
    assert rewards["seller"] == pytest.approx((1000 - env.cost) / span)
    assert rewards["buyer"] == pytest.approx((env.value - 1000) / span)
    with pytest.raises(InvalidArgumentError, match="without 'reset'"):
        bad = tmp_path / "bad_env.py"
        bad.write_text("def factory(config, seed):\n    return 42\n")
        make_custom_env(f"{bad}:factory", {}, 0)


# ---------------------------------------------------------------------------------------------- config form
def _cfg(**extra):
    data = load_config(ROOT / "examples" / "tiny.yaml").model_dump(mode="json")
    data.update(extra)
    return config_from_dict(data)


def test_workflow_section_builds_each_kind():
    names = ["agent_1", "agent_2"]
    for kind, expect in [("chain", [["agent_2"], ["agent_1"]]), ("debate", [["agent_1"], ["agent_1"]])]:
        cfg = _cfg(
            workflow={
                "kind": kind,
                "order": ["agent_2", "agent_1"] if kind == "chain" else [],
                "aggregator": "agent_2" if kind == "debate" else None,
            }
        )
        wf = workflow_from_section(cfg.workflow, names, cfg)
        assert [wf.speakers(_state(t, names)) for t in range(2)] == expect
    cfg = _cfg(workflow={"kind": "custom", "next_speakers": "builtins:list"})
    assert workflow_from_section(cfg.workflow, names, cfg).name == "custom"
    with pytest.raises(InvalidArgumentError, match="aggregator"):
        workflow_from_section(_cfg(workflow={"kind": "parallel_aggregate"}).workflow, names)
    with pytest.raises(InvalidArgumentError, match="'ghost'"):
        workflow_from_section(_cfg(workflow={"kind": "chain", "order": ["ghost"]}).workflow, names)


def test_config_rejects_trained_scripted_agent_and_bad_tasks():
    with pytest.raises(InvalidArgumentError, match="is_tuning: false"):
        _cfg(workflow={"roles": [{"agent": "agent_1", "scripted": "x:y"}]})
    with pytest.raises(InvalidArgumentError, match="repeated: a"):
        _cfg(tasks=[{"name": "a"}, {"name": "a"}])
    with pytest.raises(InvalidArgumentError, match="task_sampling=group"):
        _cfg(tasks=[{"name": "a"}], task_sampling="episode")
    with pytest.raises(InvalidArgumentError, match="weight"):
        _cfg(tasks=[{"name": "a", "weight": 0}])
    with pytest.raises(InvalidArgumentError, match="exceeds 1"):
        _cfg(allocation={"enabled": True, "min_share": 0.6})
    assert not _cfg().workflow.active


def test_example_configs_parse():
    for name in ("chain", "debate", "negotiation"):
        cfg = load_config(ROOT / "examples" / "workflows" / name / f"{name}.yaml")
        assert cfg.workflow.active


# ---------------------------------------------------------------------------------------------- scheduler
def test_scheduler_is_seeded_weighted_and_group_aligned():
    s = TaskScheduler([TaskSpec("a", 3.0), TaskSpec("b", 1.0)], seed=7)
    first = s.assign(5, 8, 2)
    assert first == s.assign(5, 8, 2)
    assert all(first[i] == first[i + 1] for i in range(0, 8, 2))
    draws = [t for step in range(400) for t in s.assign(step, 4, 1)]
    assert draws.count("a") / len(draws) == pytest.approx(0.75, abs=0.03)
    assert s.probabilities == {"a": 0.75, "b": 0.25}
    ep = TaskScheduler([TaskSpec("a"), TaskSpec("b")], seed=1, sampling="episode").assign(0, 64, 4)
    assert len(ep) == 64 and set(ep) == {"a", "b"}


@pytest.mark.parametrize(
    "args",
    [
        ([], 0, "group"),
        ([TaskSpec("a"), TaskSpec("a")], 0, "group"),
        ([TaskSpec("a", 0.0)], 0, "group"),
        ([TaskSpec("a")], 0, "batch"),
    ],
)
def test_scheduler_rejects_bad_tasks(args):
    with pytest.raises(InvalidArgumentError):
        TaskScheduler(*args)


def test_scheduler_rejects_partial_groups():
    with pytest.raises(InvalidArgumentError, match="num_episodes=6"):
        TaskScheduler([TaskSpec("a")], 0).assign(0, 6, 4)


def test_curriculum_rises_only_on_a_full_window_at_threshold():
    c = Curriculum(["t"], ["easy", "medium", "hard"], threshold=0.75, window=4)
    assert not c.record("t", [True, True, True])  # 3 of 4: window not full yet
    assert c.record("t", [False])  # T,T,T,F: exactly 0.75 rises
    assert c.level("t") == "medium" and c.success_rate("t") == 0.0  # window restarts


def test_curriculum_threshold_edge_and_top_level():
    c = Curriculum(["t"], ["easy", "hard"], threshold=0.75, window=4)
    assert not c.record("t", [True, True, False, False])  # 0.5 < 0.75
    assert not c.record("t", [True, True])  # last four F,F,T,T: 0.5
    assert c.level("t") == "easy"
    assert c.record("t", [True])  # F,T,T,T: 0.75
    c2 = Curriculum(["t"], ["easy", "hard"], threshold=0.75, window=4)
    assert c2.record("t", [True, True, True, False])
    assert c2.level("t") == "hard"
    assert not c2.record("t", [True] * 4)  # already at the top
    state = c2.state()
    c3 = Curriculum(["t"], ["easy", "hard"], threshold=0.75, window=4)
    c3.load_state(state)
    assert c3.level("t") == "hard"
    with pytest.raises(InvalidArgumentError, match="'x'"):
        c3.record("x", [True])
    with pytest.raises(InvalidArgumentError):
        Curriculum(["t"], ["easy"], threshold=1.5, window=4)
    with pytest.raises(InvalidArgumentError, match="'expert'"):
        Curriculum(["t"], ["easy"], 0.5, 4, start={"t": "expert"})


# ---------------------------------------------------------------------------------------------- allocation
def test_shares_floor_and_sum():
    s = shares_from_priorities({"a": 1.0, "b": 0.0, "c": 0.0}, min_share=0.1)
    assert s == pytest.approx({"a": 0.8, "b": 0.1, "c": 0.1})
    assert sum(s.values()) == pytest.approx(1.0)
    assert shares_from_priorities({"a": 0.0, "b": 0.0}, 0.2) == pytest.approx({"a": 0.5, "b": 0.5})
    assert shares_from_priorities({"a": 5.0, "b": 0.0}, 0.5) == pytest.approx({"a": 0.5, "b": 0.5})
    with pytest.raises(InvalidArgumentError, match="exceeds"):
        shares_from_priorities({"a": 1.0, "b": 1.0}, 0.51)


def test_priority_terms_hand_computed():
    alloc = PriorityAllocator(["a", "b"], AllocationWeights(0.5, 0.3, 0.2, min_share=0.1, window=4))
    alloc.observe({"a": 0.0, "b": 1.0}, {"a": 10.0, "b": 20.0})
    alloc.observe({"a": 1.0, "b": 1.0}, {"a": 10.0, "b": 20.0})
    t = alloc.terms()
    # a: progress |1 - 0| / (0 + 1) = 1; efficiency 10/10 = 1; urgency (1 - 0.5)/(1 - 0.5) = 1
    assert t["a"] == pytest.approx({"progress": 1.0, "efficiency": 1.0, "urgency": 1.0, "priority": 1.0})
    # b: progress 0; efficiency 10/20 = 0.5; urgency 0 -> priority 0.15
    assert t["b"] == pytest.approx({"progress": 0.0, "efficiency": 0.5, "urgency": 0.0, "priority": 0.15})
    shares = alloc.shares()
    assert shares["a"] == pytest.approx(0.1 + 0.8 * 1.0 / 1.15)
    assert shares["b"] >= 0.1


def test_quotas_and_whole_groups():
    q = quotas({"a": 0.9, "b": 0.1}, {"a": 4, "b": 10}, budget=None)
    assert q == {"a": 4, "b": 1}  # a capped at what it has, b at least one
    assert quotas({"a": 0.5}, {"a": 0}, budget=3) == {"a": 0}
    with pytest.raises(InvalidArgumentError, match="budget_samples"):
        quotas({"a": 1.0}, {"a": 1}, budget=0)
    items = [SimpleNamespace(group=g) for g in (1, 1, 2, 2, 3)]
    assert [i.group for i in take_groups(items, 3)] == [1, 1, 2, 2]
    assert [i.group for i in take_groups(items, 0)] == []
    assert len(take_groups(items, 99)) == 5


def test_allocator_never_starves_an_agent():
    rng = random.Random(0)
    alloc = PriorityAllocator(["a", "b", "c"], AllocationWeights(min_share=0.2, window=3))
    for _ in range(20):
        alloc.observe({a: rng.random() for a in "abc"}, {a: rng.randint(1, 50) for a in "abc"})
        shares = alloc.shares()
        assert min(shares.values()) >= 0.2 - 1e-12
        assert sum(shares.values()) == pytest.approx(1.0)


# ---------------------------------------------------------------------------------------------- runner hook
class _Gen:
    def __init__(self, text):
        self.text = text
        self.prompt_token_ids = [1, 2]
        self.response_token_ids = [3]
        self.response_logprobs = [-0.5]


def test_runner_workflow_hook_scripts_parses_and_recredits():
    """A custom speaker function, a parser, a scripted agent and a custom reward on a real env."""
    env_path = f"{ROOT}/examples/workflows/negotiation/negotiation.py"
    neg = load_callable(f"{env_path}:build")(None)
    prompts = []

    def generate(agent, chats):
        prompts.extend(chats)
        return [_Gen("I accept") for _ in chats]

    wf = Workflow(
        neg._next,
        roles=[
            Role("seller", policy=lambda chat: "my price is 90", parser=neg.role("seller").parser),
            Role("buyer", parser=neg.role("buyer").parser),
        ],
        reward_fn=neg.reward_fn,
    )
    runner = EpisodeRunner(
        make_env=lambda seed: make_custom_env(f"{env_path}:make_env", {"max_turns": 4}, seed),
        generate=generate,
        comm_factory=None,
        agents=["seller", "buyer"],
        roles={"seller": "seller", "buyer": "buyer"},
        system_prompts={"seller": "s", "buyer": "b"},
        policy_version=lambda a: 0,
        workflow=wf,
    )
    (res,) = runner.play([4])
    assert [(s, a) for s, a, _ in res.transcript] == [(0, "seller"), (1, "buyer")]
    assert "[seller]: my price is 90" in prompts[0][1]["content"]  # the buyer heard the seller
    assert set(res.trajectories) == {"buyer"}  # the scripted seller records no trainable turns
    assert res.returns["buyer"] == pytest.approx(res.env_returns["buyer"] + 0.2)
    assert res.metrics["task_completion"] == 1.0
    ref = make_custom_env(f"{env_path}:make_env", {"max_turns": 4}, 4)
    ref.reset(seed=4)  # the parser turned "my price is 90" into "offer: 90", and "I accept" into "accept"
    assert res.env_returns["seller"] == pytest.approx((90 - ref.cost) / (ref.value - ref.cost))
    assert res.returns["seller"] == pytest.approx(res.env_returns["seller"] + 0.2)


def test_default_runner_path_unchanged_without_workflow():
    runner = EpisodeRunner(
        make_env=lambda seed: marti.make("collaborative_task_solving", seed=seed, max_turns=2, num_agents=2),
        generate=lambda agent, chats: [_Gen("task_1: 1") for _ in chats],
        comm_factory=None,
        agents=["agent_1", "agent_2"],
        roles={"agent_1": "leader", "agent_2": "executor"},
        system_prompts={"agent_1": "a", "agent_2": "b"},
        policy_version=lambda a: 0,
    )
    (res,) = runner.play([1])
    assert res.returns == res.env_returns and res.task is None
    # one turn loop: the default (env-driven) workflow records the transcript like any other
    assert res.transcript == [(0, "agent_1", "task_1: 1"), (1, "agent_2", "task_1: 1")]
    assert [t.step for t in res.trajectories["agent_2"].turns] == [1]


def test_user_code_can_be_refused_by_a_service():
    from marti.errors import PermissionDeniedError
    from services.trainer.job.connections.addresses import Addresses
    from services.trainer.job.run.loop import TrainingLoop
    from services.trainer.job.run.summary import user_code_paths

    cfg = load_config(ROOT / "examples" / "workflows" / "negotiation" / "negotiation.yaml")
    assert user_code_paths(cfg)[0].startswith("environment.env_name=")
    with pytest.raises(PermissionDeniedError, match="environment.env_name"):
        TrainingLoop(cfg, Addresses(None, None, None), allow_user_code=False)
    assert user_code_paths(load_config(ROOT / "examples" / "tiny.yaml")) == []
    TrainingLoop(
        load_config(ROOT / "examples" / "tiny.yaml"), Addresses(None, None, None), allow_user_code=False
    )


_TEAM_JOB = {
    "training_name": "t", "num_agents": 2,
    "agents": [{"name": "a", "pretrain_model": "tiny-llama", "role": "planner"},
               {"name": "b", "pretrain_model": "tiny-llama", "role": "executor"}],
    "environment": {"env_name": "collaborative_task_solving", "scenario": "private_allocation"},
}  # fmt: skip


@pytest.mark.parametrize(
    ("workflow", "message"),
    [
        (
            {"reward_fn": "my_rewardz.py:team_bonus"},
            r"workflow\.reward_fn: import path 'my_rewardz\.py:team_bonus'",
        ),
        (
            {"roles": [{"agent": "b", "parser": "json:nope"}]},
            r"workflow\.roles\.0\.parser: .*no attribute 'nope'",
        ),
        ({"factory": "no_such_pkg_xyz:make"}, r"workflow\.factory: .*cannot import module 'no_such_pkg_xyz'"),
        ({"kind": "chain", "order": ["a", "c"]}, r"workflow\.order names agent 'c', which is not in agents"),
    ],
)
def test_a_bad_workflow_is_refused_before_an_overwrite_touches_the_old_run(tmp_path, workflow, message):
    """`marti train --overwrite` on an env job whose workflow names a path that does not load (a typo in
    workflow.reward_fn) or an agent not in the team: refused naming the key, and the previous run is kept."""
    from tests.refused_runs import train_over_an_old_run

    proc = train_over_an_old_run(tmp_path, {**_TEAM_JOB, "workflow": workflow})
    assert re.search(message, proc.stderr), proc.stderr


def test_checking_a_workflow_section_does_not_call_its_factory(tmp_path, monkeypatch):
    """check_workflow_section loads a factory without calling it (user code runs once, in the job)."""
    from marti.config import WorkflowConfig
    from marti.team.workflow import check_workflow_section

    (tmp_path / "wf_factory_xyz.py").write_text("CALLS = []\ndef make(cfg):\n    CALLS.append(cfg)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    check_workflow_section(WorkflowConfig(factory="wf_factory_xyz:make"), ["a"])
    import wf_factory_xyz

    assert wf_factory_xyz.CALLS == []


_RAISING_HOOKS = """
def reward(episode):
    raise KeyError("no_such_key")


def parser(text):
    return text.split()[99]
"""


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (
            "workflow.reward_fn={hooks}:reward",
            "workflow.reward_fn '{hooks}:reward' raised KeyError: 'no_such_key'",
        ),
        (
            "workflow.roles=[{{agent: agent_1, parser: '{hooks}:parser'}}]",
            "workflow.roles.0.parser '{hooks}:parser' of agent 'agent_1' raised IndexError: list index out of range",
        ),
    ],
)
def test_a_raising_reward_fn_or_parser_stops_marti_train_with_one_line_naming_it(tmp_path, setting, message):
    """An exception from workflow.reward_fn or a role's parser came out as a raw 60-line traceback (exit 1);
    it is one ``marti train:`` line naming the key, the import path, the agent and the exception (exit 2), as
    a bad return value from the same hooks is. A real job on the tiny model (agent_1 speaks first)."""
    import subprocess
    import sys

    hooks = tmp_path / "hooks.py"
    hooks.write_text(_RAISING_HOOKS)
    sets = [
        "environment.max_turns=1", "rollout.eval_every=0", "max_steps=1", f"output.dir={tmp_path / 'run'}",
        setting.format(hooks=hooks),
    ]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "marti.command.main", "train", "examples/tiny.yaml", "--no-progress",
         *[a for s in sets for a in ("--set", s)]],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.rstrip().splitlines()[-1] == "marti train: " + message.format(hooks=hooks)
    assert "Traceback" not in proc.stderr


def test_a_workflow_built_in_python_names_its_raising_hooks_by_module_and_name():
    def shout(text):
        raise ValueError("bad reply")

    wf = Workflow.env(roles=[Role("a", parser=shout)])
    with pytest.raises(
        InvalidArgumentError,
        match=r"^parser .*:test_a_workflow_built_in_python.*shout of agent 'a' raised "
        r"ValueError: bad reply$",
    ):
        wf.action("a", "hi")
    assert Workflow.env().action("a", "hi") == "hi"
