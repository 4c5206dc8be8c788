"""A dataset job's problems in the trainer: seeds name rows, the per-epoch order, rows in env configs, and the
reward scorers' credits through the episode runner's ``rescore`` hook, on the real ``dataset_task`` env."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

import marti
from marti.config import config_from_dict
from marti.errors import InvalidArgumentError
from services.trainer.data.tasks import DatasetTasks
from services.trainer.rollout.episodes.runner import EpisodeRunner
from services.trainer.rollout.episodes.scoring import EpisodeScorer, build_scorer

ROWS = [{"prompt": f"What is {i} + {i}? 答え", "answer": str(2 * i), "hint": f"h{i}"} for i in range(10)]


def _config(tmp_path: Path, **extra) -> object:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in ROWS), encoding="utf-8")
    data = {
        "training_name": "t",
        "num_agents": 2,
        "agents": [
            {"name": "solver", "pretrain_model": "tiny-llama", "role": "solver"},
            {"name": "judge", "pretrain_model": "tiny-llama", "role": "judge"},
        ],
        "dataset": {"path": f"jsonl:{path}", "eval_fraction": 0.2},
        "rollout": {"episodes_per_step": 4, "group_size": 2, "eval_episodes": 16, "eval_every": 1},
        "environment": {"max_turns": 2, "options": {"verifier": "numeric", "final_agent": "judge"}},
    }
    for key, value in extra.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
        if key == "rollout":  # None: leave the key unset (its default applies)
            data[key] = {k: v for k, v in data[key].items() if v is not None}
    return config_from_dict(data)


def test_fit_sizes_the_seed_schedule_to_the_rows(tmp_path):
    cfg = _config(tmp_path)
    tasks = DatasetTasks(cfg)
    fitted = tasks.fit(cfg)
    assert (tasks.n_train, tasks.n_eval) == (8, 2)
    assert fitted.rollout.num_train_seeds == 8 and fitted.rollout.train_seed_start == 0
    assert fitted.rollout.resolved_eval_seeds == [8, 9]  # eval_episodes 16 capped at the 2 held-out rows
    held = {tasks.row(s)["answer"] for s in fitted.rollout.resolved_eval_seeds}
    trained = {tasks.row(s)["answer"] for s in range(8)}
    assert not held & trained and len(held | trained) == 10


def test_held_out_rows_an_evaluation_leaves_out_are_said(tmp_path, caplog):
    """eval_episodes below the held-out row count: each evaluation plays the first rows only, and the log says
    how many of how many (the rest would otherwise never be played, silently)."""
    cfg = _config(tmp_path, dataset={"eval_fraction": 0.5}, rollout={"eval_episodes": 3})
    with caplog.at_level("WARNING", logger="marti.trainer"):
        DatasetTasks(cfg).check_evaluation(cfg)  # marti train's pre-check: the job's own fit says it, once
    assert "held-out rows" not in caplog.text
    with caplog.at_level("WARNING", logger="marti.trainer"):
        fitted = DatasetTasks(cfg).fit(cfg)
    assert fitted.rollout.resolved_eval_seeds == [5, 6, 7]
    assert "plays the first 3 of the 5 held-out rows (rollout.eval_episodes=3)" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="marti.trainer"):
        DatasetTasks(_config(tmp_path)).fit(_config(tmp_path))  # 16 asked, 2 held out: all of them played
    assert "held-out rows" not in caplog.text


def test_held_out_rows_that_repeat_a_training_prompt_are_said(tmp_path, caplog):
    """A file with duplicate rows split by eval_fraction (or a held-out file repeating training rows) put copies
    of training problems in the held-out set without a word, so held-out accuracy counted trained rows as
    unseen; the job's log says how many, naming the first pair (the rows still train and evaluate)."""
    dup = tmp_path / "dup.jsonl"
    dup.write_text(
        "".join(json.dumps(r) + "\n" for r in ROWS + ROWS[:4]), encoding="utf-8"
    )  # rows 10-13 repeat 0-3
    cfg = _config(tmp_path, dataset={"path": f"jsonl:{dup}", "eval_fraction": 0.5})
    tasks = DatasetTasks(cfg)
    with caplog.at_level("WARNING", logger="marti.trainer"):
        tasks.fit(cfg)
    train = [tasks.problems.train.prompt(i) for i in range(tasks.n_train)]
    held = [tasks.problems.eval.prompt(j) for j in range(tasks.n_eval)]
    shared = sum(p in train for p in held)
    assert shared > 0  # this seed's split puts copies on both sides
    assert re.search(
        rf"{shared} of the 7 held-out rows have the prompt of a training row \(row \d+ \(.*dup\.jsonl:\d+\) of "
        r"dataset .*dup\.jsonl.* is row \d+ \(.*dup\.jsonl:\d+\) of dataset .*\): the held-out accuracy counts them "
        r"as unseen",
        caplog.text,
    ), caplog.text


def test_held_out_rows_are_compared_on_every_column_the_agents_see(tmp_path, caplog):
    """The README's data example (examples/data/pick_team.yaml) warned that "24 of the 24 held-out rows have the
    prompt of a training row ... remove the duplicate rows": every row's executor ``prompt`` is the same, but its
    leader sees ``leader_view`` (``environment.options.agent_inputs``), which tells the rows apart. A held-out row
    repeats a training problem only when every column an agent sees repeats, and the warning names them."""
    rows = [{"prompt": "Which task?", "view": f"order {i % 7}", "answer": str(i % 7)} for i in range(14)]
    path = tmp_path / "views.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    options = {"agent_inputs": {"judge": "view"}}
    cfg = _config(
        tmp_path, dataset={"path": f"jsonl:{path}", "eval_fraction": 0.5}, environment={"options": options}
    )
    tasks = DatasetTasks(cfg)
    train = {tasks.problems.train.row(i)["view"] for i in range(tasks.n_train)}
    shared = sum(tasks.problems.eval.row(j)["view"] in train for j in range(tasks.n_eval))
    assert 0 < shared < tasks.n_eval  # this seed's split: some held-out views repeat, some do not
    with caplog.at_level("WARNING", logger="marti.trainer"):
        tasks.fit(cfg)
    assert (
        f"{shared} of the 7 held-out rows have the inputs of a training row (columns ['prompt', 'view'], what "
        in (caplog.text)
    ), caplog.text
    unique = [{**r, "view": f"order {i}"} for i, r in enumerate(rows)]
    path.write_text("".join(json.dumps(r) + "\n" for r in unique), encoding="utf-8")
    caplog.clear()
    with caplog.at_level("WARNING", logger="marti.trainer"):
        DatasetTasks(cfg).fit(cfg)
    assert "of a training row" not in caplog.text  # one prompt for all, yet no two rows alike


def test_no_held_out_set_with_evaluation_on_is_refused_before_the_job(tmp_path):
    cfg = _config(tmp_path, dataset={"eval_fraction": None})
    with pytest.raises(InvalidArgumentError, match="no held-out set.*eval_every: 0"):
        DatasetTasks(cfg).fit(cfg)
    off = _config(tmp_path, dataset={"eval_fraction": None}, rollout={"eval_every": 0})
    assert DatasetTasks(off).fit(off).rollout.num_train_seeds == 10


def test_without_a_held_out_set_evaluation_is_off_unless_asked_for(tmp_path):
    """The design script gives ``--dataset`` alone: its job trains without evaluations (nothing is held out),
    while an ``eval_every`` the user gives is still refused above."""
    cfg = _config(tmp_path, dataset={"eval_fraction": None}, rollout={"eval_every": None})
    assert cfg.rollout.eval_every == 0
    assert DatasetTasks(cfg).fit(cfg).rollout.eval_every == 0
    held = _config(tmp_path, rollout={"eval_every": None})  # a held-out split keeps the default
    assert held.rollout.eval_every == 10


def test_each_epoch_plays_every_row_once_in_a_fresh_order_and_resumes_at_the_right_row(tmp_path):
    tasks = DatasetTasks(_config(tmp_path))
    steps = [tasks.train_seeds(step, problems_per_step=2, group_size=2) for step in range(8)]
    for s in steps:  # groups: consecutive equal seeds
        assert s[0] == s[1] and s[2] == s[3]
    problems = [s[0] for s in steps] and [seed for s in steps for seed in s[::2]]
    first, second = problems[:8], problems[8:]
    assert Counter(first) == Counter(range(8)) == Counter(second)
    assert first != second  # a new order each epoch
    again = DatasetTasks(_config(tmp_path))  # a resumed job computes a step's rows from the step alone
    assert again.train_seeds(5, problems_per_step=2, group_size=2) == steps[5]


def test_a_seed_past_the_rows_is_named(tmp_path):
    tasks = DatasetTasks(_config(tmp_path))
    with pytest.raises(InvalidArgumentError, match="problem seed 10 names no row: 8 training rows"):
        tasks.row(10)


def test_the_env_config_carries_the_row_and_the_real_env_plays_it_unchanged(tmp_path):
    cfg = _config(tmp_path)
    tasks = DatasetTasks(cfg)
    conf = tasks.env_config(cfg, 3)
    assert conf["row"] == tasks.row(3) and conf["agents"] == ["solver", "judge"]
    assert conf["verifier"] == "numeric" and conf["label_key"] == "answer" and conf["max_turns"] == 2
    env = marti.make("dataset_task", seed=3, **conf)
    obs, _ = env.reset(seed=3)
    assert obs["solver"] == tasks.row(3)["prompt"]  # full Unicode, unchanged
    env.step({"solver": "no idea", "judge": ""})
    _, rewards, *_ = env.step({"solver": "", "judge": f"Answer: {tasks.row(3)['answer']}"})
    assert rewards["judge"] == 1.0


class _Gen:
    def __init__(self, text):
        self.text, self.prompt_token_ids, self.response_token_ids, self.response_logprobs = (
            text,
            [1],
            [2],
            [-1.0],
        )


def _scored_runner(cfg, reply, workflow=None) -> EpisodeRunner:
    """A runner of the solver/judge team on the real dataset_task env, ``reply(agent)`` answering for each agent,
    its episodes re-scored by the config's reward section."""
    tasks = DatasetTasks(cfg)
    scorer = EpisodeScorer(cfg, tasks, build_scorer(cfg, None))
    return EpisodeRunner(
        make_env=lambda seed: marti.make("dataset_task", seed=seed, **tasks.env_config(cfg, seed)),
        generate=lambda agent, chats: [_Gen(reply(agent)) for _ in chats],
        comm_factory=None,
        agents=["solver", "judge"],
        roles={"solver": "solver", "judge": "judge"},
        system_prompts={"solver": "s", "judge": "j"},
        policy_version=lambda a: 0,
        workflow=workflow,
        rescore=scorer.rescore,
    )


def _reward_file(tmp_path: Path) -> str:
    path = tmp_path / "rewards.py"
    path.write_text(
        "def length_and_hint(prompts, completions, answer, hint, **kw):\n"
        "    assert all(p.startswith('What is') for p in prompts)\n"
        "    return [float(len(c)) + float(a) / 100 for c, a in zip(completions, answer)]\n"
    )
    return f"{path}:length_and_hint"


def test_reward_functions_replace_the_verifier_through_the_runner(tmp_path):
    cfg = _config(tmp_path, reward={"functions": [_reward_file(tmp_path)]})
    cfg = cfg.model_copy(
        update={"environment": cfg.environment.model_copy(update={"options": {"final_agent": "judge",
                                                                              "own_weight": 0.25}})}
    )  # fmt: skip
    tasks = DatasetTasks(cfg)
    replies = {"solver": "abc", "judge": "abcdefgh"}
    runner = _scored_runner(cfg, replies.__getitem__, marti.team.workflow.Workflow.chain(["solver", "judge"]))
    results = runner.play([2, 5])
    for seed, res in zip([2, 5], results, strict=True):
        bonus = float(tasks.row(seed)["answer"]) / 100  # the row's columns reach the function
        # team: the judge's reply (8 chars); own: solver 3, judge 8
        assert res.returns["solver"] == pytest.approx(0.75 * (8 + bonus) + 0.25 * (3 + bonus))
        assert res.returns["judge"] == pytest.approx(8 + bonus)
        assert res.env_returns == {"solver": 0.0, "judge": 0.0}  # the verifier's: both answers wrong
        assert res.metrics["task_completion"] == 0.0


def test_a_reward_function_returning_nan_stops_the_rollout_naming_it(tmp_path):
    path = tmp_path / "bad.py"
    path.write_text("def nan(prompts, completions, **kw):\n    return [float('nan')] * len(completions)\n")
    cfg = _config(tmp_path, reward={"functions": [f"{path}:nan"]})
    runner = _scored_runner(cfg, lambda agent: "4")
    with pytest.raises(InvalidArgumentError, match="bad.py:nan"):
        runner.play([1])


def test_a_bad_dataset_is_refused_before_an_overwrite_touches_the_old_run(tmp_path):
    """`marti train --overwrite` with a misspelled column: refused naming it, and the previous run is kept."""
    from tests.refused_runs import train_over_an_old_run

    cfg = _config(tmp_path)
    proc = train_over_an_old_run(
        tmp_path,
        {"training_name": "t", "num_agents": 1,
         "agents": [{"name": "solver", "pretrain_model": "tiny-llama", "role": "solver"}],
         "dataset": {"path": cfg.dataset.path, "input_key": "promt", "eval_fraction": 0.2}},
    )  # fmt: skip
    assert "promt" in proc.stderr and "did you mean 'prompt'" in proc.stderr


def test_a_causal_lm_as_reward_model_is_refused_before_the_job(tmp_path):
    from transformers import LlamaConfig

    from services.trainer.job.run.prechecks import check_dataset_job

    folder = tmp_path / "causal"
    LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                architectures=["LlamaForCausalLM"]).save_pretrained(folder)  # fmt: skip
    cfg = _config(tmp_path, reward={"model": str(folder)})
    with pytest.raises(
        InvalidArgumentError, match=r"^reward.model \(--reward_model\): .*causal'.*not a sequence"
    ):
        check_dataset_job(cfg)
    from marti.errors import NotFoundError

    with pytest.raises(NotFoundError, match=r"^reward.model \(--reward_model\): .*is not a folder"):
        check_dataset_job(_config(tmp_path, reward={"model": str(tmp_path / "nowhere")}))
    LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_labels=1,
                architectures=["LlamaForSequenceClassification"]).save_pretrained(folder)  # fmt: skip
    with pytest.raises(
        NotFoundError, match=r"^reward.model \(--reward_model\): .*no tokenizer can be loaded"
    ):
        check_dataset_job(cfg)  # config.json alone: found before the job, not when the actor starts


def test_a_bad_remote_reward_url_names_its_key_and_flag_before_the_job(tmp_path):
    from services.trainer.job.run.prechecks import check_dataset_job

    with pytest.raises(
        InvalidArgumentError, match=r"^reward.remote_url \(--remote_rm_url\): .*got 'notaurl'"
    ):
        check_dataset_job(_config(tmp_path, reward={"remote_url": "notaurl"}))
    check_dataset_job(
        _config(tmp_path, reward={"model": "tiny-llama"})
    )  # built by the actor: no file to check


def test_a_reward_server_that_is_down_stops_the_job_instead_of_a_replay(tmp_path):
    """An unreachable server, after its own retries, is not an outage of the job's services (whose errors the
    loop's reconnect replays a rollout for): the rollout fails with FailedPreconditionError naming the URL."""
    from marti.errors import FailedPreconditionError

    url = "http://127.0.0.1:9/get_reward"  # the discard port: nothing listens
    cfg = _config(tmp_path, reward={"remote_url": url, "remote_retries": 0, "remote_timeout_s": 2})
    runner = _scored_runner(cfg, lambda agent: "4")
    with pytest.raises(FailedPreconditionError, match=r"reward scoring failed: .*127\.0\.0\.1:9"):
        runner.play([1])


def test_a_label_the_verifier_cannot_read_is_named_with_its_row_before_the_job(tmp_path):
    from services.trainer.job.run.prechecks import check_dataset_job

    cfg = _config(tmp_path, environment={"options": {"verifier": "multiple_choice"}})  # labels are numbers
    with pytest.raises(
        InvalidArgumentError,
        match=r"row \d+ \(.*rows\.jsonl:\d+\) of dataset .*rows\.jsonl.*multiple_choice verifier",
    ):
        check_dataset_job(cfg)
    check_dataset_job(_config(tmp_path))  # numeric: every label reads


def test_no_label_column_and_a_nan_weight_are_refused_at_config_load(tmp_path):
    with pytest.raises(InvalidArgumentError, match="dataset.label_key is null, but the 'dataset_task' env"):
        _config(tmp_path, dataset={"label_key": None})
    with pytest.raises(InvalidArgumentError, match="function_weights.0.*finite"):
        _config(tmp_path, reward={"functions": [_reward_file(tmp_path)], "function_weights": [float("nan")]})
