"""Data problems a fresh user meets, refused by ``marti train`` before the run folder (so an ``--overwrite`` keeps
the previous run), each reproduced with a real dataset file: a column the reward functions cannot be passed, a
prompt longer than the model's context."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from marti.errors import InvalidArgumentError, NotFoundError
from tests.refused_runs import train_over_an_old_run


def _rows_file(tmp_path: Path, rows: list[dict[str, Any]]) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _job(data: Path, **extra: Any) -> dict[str, Any]:
    """A one-agent dataset job on the tiny model (``extra``: more top-level sections)."""
    return {
        "training_name": "t",
        "num_agents": 1,
        "agents": [{"name": "solver", "pretrain_model": "tiny-llama", "role": "solver"}],
        "dataset": {"path": f"jsonl:{data}", "eval_fraction": 0.2},
        **extra,
    }


def test_a_column_named_prompts_is_refused_before_an_overwrite_with_reward_functions(tmp_path):
    """The reward call's own keyword ``prompts`` as a column was found only at the first scoring call."""
    reward = tmp_path / "my_rewards.py"
    reward.write_text(
        "def length(prompts, completions, **kw):\n    return [float(len(c)) for c in completions]\n"
    )
    rows = [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i), "prompts": "x"} for i in range(10)]
    data = _rows_file(tmp_path, rows)
    proc = train_over_an_old_run(tmp_path, _job(data, reward={"functions": [f"{reward}:length"]}))
    assert f"dataset JSON file '{data}'" in proc.stderr
    assert (
        "dataset column 'prompts' collides with the keyword prompts= of the reward function call"
        in proc.stderr
    )
    assert "rename the column" in proc.stderr


def test_a_reward_function_called_directly_refuses_a_reserved_column_by_the_same_rule():
    from marti.rewards import RewardFunction

    fn = RewardFunction(lambda prompts, completions, **kw: [1.0] * len(completions))
    with pytest.raises(
        InvalidArgumentError, match=r"column 'completions' collides with the keyword completions="
    ):
        fn.score(["p"], ["c"], {"completions": ["x"]})


def test_a_prompt_longer_than_the_models_context_is_refused_before_an_overwrite(tmp_path):
    """Found mid-run before, by the rollout engine, as 'prompt 3: N tokens + max_new_tokens ...' in a Ray
    traceback. tiny-llama takes 2048 tokens (its max_position_embeddings) and replies get rollout.max_new_tokens."""
    rows = [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(10)]
    rows[6]["prompt"] = "Add up: " + " + ".join(["1"] * 1200)  # about 2400 tokens
    data = _rows_file(tmp_path, rows)
    proc = train_over_an_old_run(tmp_path, _job(data, rollout={"eval_every": 0}))
    found = re.search(
        rf"row 6 \({re.escape(str(data))}:7\) of dataset JSON file '{re.escape(str(data))}'.*: agent 'solver''s first prompt \(its system prompt "
        r"and the row's 'prompt' text, in its chat template\) is (\d+) tokens; with rollout.max_new_tokens 128 for "
        r"its reply that is (\d+) tokens, beyond the 2048 the rollout engine takes \(max_position_embeddings of "
        r"agents\[0\].pretrain_model 'tiny-llama'\)",
        proc.stderr,
    )
    assert found, proc.stderr
    assert int(found[1]) > 2048 - 128 and int(found[2]) == int(found[1]) + 128


def test_every_prompt_that_fits_passes_and_the_count_is_the_rollouts(tmp_path):
    """The precheck counts what the rollout renders: the chat template over the system prompt and the row's text."""
    from marti.config import config_from_dict
    from services.trainer.data.tasks import DatasetTasks
    from services.trainer.job.run.prompt_lengths import check_prompt_lengths
    from services.trainer.models.loading import load_tokenizer
    from services.trainer.rollout.engines.base import chat_to_ids
    from services.trainer.rollout.episodes.runner import agent_system_prompt

    long = "Add up: " + " + ".join(["1"] * 300)
    rows = [{"prompt": long if i == 3 else f"What is {i}?", "answer": str(i)} for i in range(10)]
    job = _job(_rows_file(tmp_path, rows), rollout={"eval_every": 0})
    cfg = config_from_dict(job)
    tasks = DatasetTasks(cfg)
    check_prompt_lengths(cfg, tasks)  # every row fits
    chat = [
        {"role": "system", "content": agent_system_prompt(cfg.agents[0])},
        {"role": "user", "content": long},
    ]
    n = len(chat_to_ids(load_tokenizer("tiny-llama"), chat))
    tight = config_from_dict({**job, "rollout": {"eval_every": 0, "max_new_tokens": 2048 - n + 1}})
    with pytest.raises(
        InvalidArgumentError,
        match=rf"row 3 \(.*rows\.jsonl:4\) of .* is {n} tokens; with rollout.max_new_tokens",
    ):
        check_prompt_lengths(tight, DatasetTasks(tight))
    check_prompt_lengths(
        config_from_dict({**job, "rollout": {"eval_every": 0, "max_new_tokens": 2048 - n}}), tasks
    )


def test_a_large_dataset_is_said_before_its_prompts_are_checked(tmp_path, monkeypatch, capsys):
    """The check renders every row per agent (300,000 rows: 65 s with nothing shown): from SAY_ROWS rows on it
    says so on stderr first; below, it is silent."""
    from marti.config import config_from_dict
    from services.trainer.data.tasks import DatasetTasks
    from services.trainer.job.run import prompt_lengths

    rows = [{"prompt": f"What is {i}?", "answer": str(i)} for i in range(10)]
    cfg = config_from_dict(_job(_rows_file(tmp_path, rows), rollout={"eval_every": 0}))
    monkeypatch.setattr(prompt_lengths, "SAY_ROWS", 11)
    prompt_lengths.check_prompt_lengths(cfg, DatasetTasks(cfg))
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(prompt_lengths, "SAY_ROWS", 10)
    prompt_lengths.check_prompt_lengths(cfg, DatasetTasks(cfg))
    assert (
        "checking that the first prompt of each of the 10 rows fits the rollout engine, for each of the 1 "
        "agents (Ctrl-C stops cleanly) ..." in capsys.readouterr().err
    )


def test_a_too_long_prompt_that_reaches_the_rollout_names_its_dataset_row(tmp_path):
    """The defence behind the precheck: mid-run the engine's 'prompt I: ...' (I a position in a generation batch,
    split among engines) becomes the episode's dataset row, the agent and the turn."""
    import marti
    from marti.config import config_from_dict
    from services.trainer.data.tasks import DatasetTasks
    from services.trainer.models.loading import load_tokenizer
    from services.trainer.rollout.engines.instant import InstantRolloutEngine
    from services.trainer.rollout.engines.pool import EnginePool
    from services.trainer.rollout.episodes.runner import EpisodeRunner

    rows = [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(10)]
    rows[7]["prompt"] = "Add up: " + " + ".join(["1"] * 200)
    data = _rows_file(tmp_path, rows)
    cfg = config_from_dict(_job(data, rollout={"eval_every": 0}))
    tasks = DatasetTasks(cfg)
    seed = next(s for s in range(tasks.n_train) if tasks.describe(s).startswith("row 7 "))
    tok = load_tokenizer("tiny-llama")
    pool = EnginePool([InstantRolloutEngine({"solver": tok}, max_model_len=400) for _ in range(2)])
    runner = EpisodeRunner(
        make_env=lambda s: marti.make("dataset_task", seed=s, **tasks.env_config(cfg, s)),
        generate=lambda agent, chats: pool.generate(agent, chats),
        comm_factory=None,
        agents=["solver"],
        roles={"solver": "solver"},
        system_prompts={"solver": "s"},
        policy_version=lambda a: 0,
        describe_seed=tasks.describe,
    )
    seeds = [s for s in range(tasks.n_train) if s != seed][:3] + [seed]  # position 3: the second engine's 2nd
    with pytest.raises(InvalidArgumentError) as info:
        runner.play(seeds)
    assert re.match(
        rf"row 7 \({re.escape(str(data))}:8\) of dataset JSON file '{re.escape(str(data))}'.*, agent 'solver', turn 0 \(episode run-\d+-\w+\): its "
        r"prompt is too long: prompt 3: \d+ tokens \+ max_new_tokens 64 exceeds max_model_len 400$",
        str(info.value),
    ), str(info.value)


def test_with_a_workflow_the_roles_system_prompt_is_counted_and_scripted_agents_are_not(tmp_path):
    from marti.config import config_from_dict
    from services.trainer.data.tasks import DatasetTasks
    from services.trainer.job.run.prompt_lengths import check_prompt_lengths

    script = tmp_path / "scripted.py"
    script.write_text("def judge(chat):\n    return 'Answer: 0'\n")
    rows = [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(10)]
    job = _job(_rows_file(tmp_path, rows), rollout={"eval_every": 0})
    job["num_agents"] = 2
    job["agents"].append(
        {"name": "judge", "pretrain_model": "tiny-llama", "role": "judge", "is_tuning": False}
    )
    long = "Think. " * 1000  # about 2000 tokens
    job["environment"] = {"max_turns": 2}
    job["workflow"] = {"kind": "chain", "order": ["solver", "judge"],
                       "roles": [{"agent": "judge", "system_prompt": long, "scripted": f"{script}:judge"}]}  # fmt: skip
    cfg = config_from_dict(job)
    check_prompt_lengths(cfg, DatasetTasks(cfg))  # the judge is scripted: it generates nothing
    job["workflow"]["roles"] = [{"agent": "solver", "system_prompt": long + "You are {name}."}]
    cfg = config_from_dict(job)
    with pytest.raises(
        InvalidArgumentError,
        match=r"^row \d+ \(.*rows\.jsonl:\d+\) of dataset .*: agent 'solver''s first prompt",
    ):
        check_prompt_lengths(cfg, DatasetTasks(cfg))


def test_a_csv_cell_over_128_kib_reaches_the_prompt_length_check(tmp_path):
    """A 200 kB prompt in a CSV cell stopped marti's CSV check with a raw ``_csv.Error``; it is refused by the
    prompt-length check instead, which names the row, the agent and the token count."""
    import csv

    from marti.config import config_from_dict
    from services.trainer.job.run.prechecks import check_dataset_job

    data = tmp_path / "rows.csv"
    with open(data, "w", newline="", encoding="utf-8") as f:
        big = "Add up: " + " + ".join(["1"] * 50_000)  # 200 kB
        csv.writer(f).writerows(
            [["prompt", "answer"], *([big if i == 4 else f"What is {i}?", str(i)] for i in range(10))]
        )
    job = {**_job(data, rollout={"eval_every": 0}), "dataset": {"path": f"csv:{data}", "eval_fraction": 0.2}}
    with pytest.raises(
        InvalidArgumentError,
        match=r"row 4 \(.*rows\.csv:6\) of dataset CSV file .*: agent 'solver''s first prompt .* is \d+ tokens",
    ):
        check_dataset_job(config_from_dict(job))


_REWARDS = """
def boom(prompts, completions, **kwargs):
    raise RuntimeError("my reward has a bug")


def two_args(prompts, completions):
    return [1.0] * len(completions)


def exact(prompts, completions, label, **kwargs):
    return [float(c.strip() == l) for c, l in zip(completions, label)]
"""


@pytest.mark.parametrize(
    ("fn", "error"),
    [
        ("boom", "RuntimeError: my reward has a bug"),
        ("two_args", "TypeError: two_args() got an unexpected keyword argument 'answer'"),
        (
            "exact",
            "TypeError: exact() missing 1 required positional argument: 'label'",
        ),  # the docs' own example
    ],
)
def test_a_reward_function_that_fails_when_called_is_refused_before_an_overwrite(tmp_path, fn, error):
    """Only loading was checked before: the call failed at the first scoring, after ``--overwrite`` had deleted
    the previous run. Each function is now called once on the first two training rows (label_key ``answer``)."""
    reward = tmp_path / "my_rewards.py"
    reward.write_text(_REWARDS)
    rows = [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(10)]
    data = _rows_file(tmp_path, rows)
    proc = train_over_an_old_run(tmp_path, _job(data, reward={"functions": [f"{reward}:{fn}"]}))
    assert re.search(
        rf"marti train: reward.functions, called once before the run on row \d+ \({re.escape(str(data))}:\d+\) "
        rf"and row \d+ \({re.escape(str(data))}:\d+\) of dataset JSON file "
        rf"'{re.escape(str(data))}'.* with \['\d+', '\d+'\] as the completions: reward function "
        rf"'{re.escape(str(reward))}:{fn}' raised {re.escape(error)} \(scoring 2 completions; .*keywords: prompts, "
        r"completions, answer\)",
        proc.stderr,
    ), proc.stderr


def test_the_precheck_calls_a_good_reward_function_as_scoring_does(tmp_path):
    """The same keywords as a scoring call: the prompts, the labels as the completions and every column by name."""
    from marti.config import config_from_dict
    from services.trainer.job.run.prechecks import check_dataset_job

    seen = tmp_path / "seen.json"
    reward = tmp_path / "my_rewards.py"
    reward.write_text(
        "import json\n"
        "def record(prompts, completions, answer, extra, **kwargs):\n"
        f"    open({str(seen)!r}, 'w').write(json.dumps([prompts, completions, answer, extra, kwargs]))\n"
        "    return [1.0] * len(completions)\n"
    )
    rows = [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i), "extra": i} for i in range(10)]
    job = _job(_rows_file(tmp_path, rows), reward={"functions": [f"{reward}:record"]})
    tasks = check_dataset_job(config_from_dict(job))
    rows = [tasks.row(0), tasks.row(1)]  # the first two training rows, each with its label as the completion
    assert json.loads(seen.read_text()) == [
        [r["prompt"] for r in rows],
        [r["answer"] for r in rows],
        [r["answer"] for r in rows],
        [r["extra"] for r in rows],
        {},
    ]


def test_a_reward_function_that_returns_one_score_whatever_the_batch_is_refused_before_the_job(tmp_path):
    """The check called a function with one completion, so ``return [score]`` passed it and stopped the job at
    its first scoring (a scoring call has the team's reply and each agent's own); it now scores two rows."""
    from marti.config import config_from_dict
    from services.trainer.job.run.prechecks import check_dataset_job

    reward = tmp_path / "my_rewards.py"
    reward.write_text("def one(prompts, completions, **kwargs):\n    return [1.0]\n")
    rows = [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(10)]
    job = _job(_rows_file(tmp_path, rows), reward={"functions": [f"{reward}:one"]})
    with pytest.raises(InvalidArgumentError, match=r"returned 1 scores for 2 completions"):
        check_dataset_job(config_from_dict(job))


@pytest.mark.parametrize("custom_env", [False, True])
def test_a_missing_label_column_suggests_label_key_null_only_where_the_config_takes_it(tmp_path, custom_env):
    """The loader suggested ``label_key: null`` in a ``dataset_task`` job too, a setting its config then refuses
    (the env's verifier reads every row's label); a custom env by import path takes it."""
    from marti.config import config_from_dict
    from services.trainer.data.tasks import DatasetTasks

    data = _rows_file(tmp_path, [{"prompt": f"What is {i} + {i}?"} for i in range(10)])
    env = {"environment": {"env_name": "my_env.py:make"}} if custom_env else {}
    job = _job(data, **env)
    with pytest.raises(InvalidArgumentError, match=r"label_key 'answer' is not a column") as err:
        DatasetTasks(config_from_dict(job))
    suggested = "(or label_key: null when the reward needs no label)" in str(err.value)
    assert suggested == custom_env, str(err.value)
    with_null = {**job, "dataset": {**job["dataset"], "label_key": None}}
    if custom_env:
        assert DatasetTasks(config_from_dict(with_null)).n_train == 8  # the hint's setting loads
    else:
        assert "the job's verifier reads every row's label: name the label column" in str(err.value)
        with pytest.raises(InvalidArgumentError, match="dataset.label_key is null"):
            config_from_dict(with_null)


def _closed_port_url() -> str:
    """A URL on 127.0.0.1 where nothing listens (a port bound on 0 and released)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/get_reward"


@pytest.mark.parametrize(
    ("answer", "error", "message"),
    [
        (None, "UnavailableError", r"unreachable \(ConnectError"),
        ((500, b"oops"), "UnavailableError", r"answered HTTP 500 \('oops'\) after 1 attempt"),
        (
            (200, b"{not json"),
            "InvalidArgumentError",
            r"answered something that is not JSON \('\{not json'\)",
        ),
        ((200, b'{"scores": [1.0]}'), "InvalidArgumentError", r"the answer has no 'rewards' list"),
        ("slow", "DeadlineExceededError", r"no answer within timeout_s=0.3 s"),
    ],
)
def test_a_reward_server_that_is_down_or_answers_badly_is_refused_before_the_job(
    tmp_path, answer, error, message
):
    """The server was first called at the first scoring, after Ray, the models and a rollout had started (a
    server that was down was found only then); it is now called once on the first row before the run folder,
    and its error keeps its class, prefixed by the key, its flag and the row."""
    import marti.errors
    from marti.config import config_from_dict
    from services.trainer.job.run.prechecks import check_dataset_job
    from tests.integration.rewards.test_remote_rewards import Server

    def behaviour(n: int, body: dict) -> tuple[int, bytes]:
        if answer == "slow":
            server.release.wait(10)
            return 200, b'{"rewards": [1.0]}'
        return answer

    server = Server(behaviour) if answer is not None else None
    url = server.url if server is not None else _closed_port_url()
    rows = [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(10)]
    reward = {"remote_url": url, "remote_retries": 0, "remote_timeout_s": 0.3}
    expected = (
        r"^reward.remote_url \(--remote_rm_url\), called once before the run on row \d+ \(.*rows\.jsonl:\d+\) and "
        r"row \d+ \(.*rows\.jsonl:\d+\) of dataset JSON "
        r"file "
        rf".* with \['\d+', '\d+'\] as the completions: remote reward server '{re.escape(url)}' .*{message}"
    )
    try:
        with pytest.raises(getattr(marti.errors, error), match=expected):
            check_dataset_job(config_from_dict(_job(_rows_file(tmp_path, rows), reward=reward)))
    finally:
        if server is not None:
            server.stop()


def test_the_precheck_sends_a_good_reward_server_one_request_as_scoring_does(tmp_path):
    from marti.config import config_from_dict
    from services.trainer.job.run.prechecks import check_dataset_job
    from tests.integration.rewards.test_remote_rewards import Server, length_reward

    server = Server(length_reward)
    rows = [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(10)]
    try:
        tasks = check_dataset_job(
            config_from_dict(_job(_rows_file(tmp_path, rows), reward={"remote_url": server.url}))
        )
    finally:
        server.stop()
    rows = [tasks.row(0), tasks.row(1)]
    assert server.bodies == [
        {
            "query": [r["prompt"] + r["answer"] for r in rows],
            "prompts": [r["prompt"] for r in rows],
            "labels": [r["answer"] for r in rows],
        }
    ]


@pytest.mark.parametrize(
    ("source", "fn", "error", "message"),
    [
        ("def f(prompts, completions, **kw)\n    return [1.0]\n", "f", InvalidArgumentError, "SyntaxError"),
        ("X = 3\n", "X", InvalidArgumentError, "names a value of type int, not a callable"),
        ("X = 3\n", "nope", NotFoundError, "has no attribute 'nope'"),
    ],
)
def test_a_reward_function_that_does_not_load_is_refused_naming_its_key(tmp_path, source, fn, error, message):
    """The load error named the import path only; it now names the key it came from, as the workflow's do."""
    from marti.config import config_from_dict
    from services.trainer.job.run.prechecks import check_dataset_job

    reward = tmp_path / "my_rewards.py"
    reward.write_text(source)
    rows = [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(10)]
    job = _job(_rows_file(tmp_path, rows), reward={"functions": [f"{reward}:{fn}"]})
    with pytest.raises(error, match=rf"^reward\.functions: import path '.*my_rewards\.py:{fn}'.*{message}"):
        check_dataset_job(config_from_dict(job))
