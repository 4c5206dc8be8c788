"""The ``dataset:`` config section: validated at config load (types, one held-out split, a missing local file
named before the job starts), its seed defaulting to the job's."""

from __future__ import annotations

import pytest
import yaml

from marti.config import DatasetConfig, config_from_dict, config_from_text, dump_config, load_config
from marti.config.sections.reward import RewardConfig
from marti.errors import InvalidArgumentError
from tests.unit.data.files import jsonl

BASE = {"training_name": "t", "agents": [{"name": "a", "pretrain_model": "m", "role": "solver"}]}


def with_dataset(**section):
    return {**BASE, "dataset": section}


def test_no_section_means_no_dataset():
    assert config_from_dict(BASE).dataset is None


def test_a_missing_file_is_named_at_config_load(tmp_path):
    cfg_file = tmp_path / "job.yaml"
    cfg_file.write_text(yaml.safe_dump(with_dataset(path=f"json:{tmp_path}/data/missing.json")))
    with pytest.raises(
        InvalidArgumentError,
        match=rf"job\.yaml: 'dataset\.path': dataset JSON file '{tmp_path}/data/missing\.json' does not exist \(got",
    ):
        load_config(cfg_file)
    held = with_dataset(path=str(jsonl(tmp_path, [{"prompt": "p", "answer": "a"}])), eval_path="nope.jsonl")
    with pytest.raises(
        InvalidArgumentError,
        match=r"'dataset\.eval_path': .*'nope\.jsonl' does not exist \(relative to the working directory",
    ):
        config_from_dict(held)


def test_the_seed_defaults_to_the_jobs(tmp_path):
    path = str(jsonl(tmp_path, [{"prompt": "p", "answer": "a"}]))
    assert config_from_dict({**with_dataset(path=path), "seed": 11}).dataset.seed == 11
    assert config_from_dict({**with_dataset(path=path, seed=4), "seed": 11}).dataset.seed == 4
    cfg = config_from_dict({**with_dataset(path=path, eval_fraction=0.25), "seed": 11})
    assert config_from_text(dump_config(cfg)) == cfg


def test_a_hub_id_is_not_checked_at_load():
    cfg = config_from_dict(with_dataset(path="openai/gsm8k:main@test", input_key="question"))
    assert cfg.dataset.path == "openai/gsm8k:main@test" and cfg.dataset.split is None


@pytest.mark.parametrize(
    ("section", "fragment"),
    [
        ({"eval_fraction": 0.2, "eval_path": "hf:org/x"}, "eval_path and dataset.eval_fraction are both set"),
        ({"eval_fraction": 1.0}, "'dataset.eval_fraction': Input should be less than 1"),
        ({"eval_fraction": 0}, "'dataset.eval_fraction': Input should be greater than 0"),
        ({"max_samples": 0}, "'dataset.max_samples': Input should be greater than or equal to 1"),
        ({"input_key": 3}, "'dataset.input_key': Input should be a valid string"),
        ({"input_key": " "}, "'dataset.input_key': must name a column"),
        ({"label_key": ""}, "'dataset.label_key': must name a column"),
        ({"label_key": "prompt"}, "input_key and dataset.label_key are the same column 'prompt'"),
        ({"shuffle": "maybe"}, "'dataset.shuffle': must be true or false"),
        ({"shuffle": 1}, "'dataset.shuffle': must be true or false"),
        ({"max_samples": True}, "'dataset.max_samples': must be a number, not a boolean"),
        ({"max_samples": "5"}, "'dataset.max_samples': Input should be a valid integer"),
        ({"seed": True}, "'dataset.seed': must be a number, not a boolean"),
        ({"eval_fraction": True}, "'dataset.eval_fraction': must be a number, not a boolean"),
        ({"split": "test", "path": "org/x@train"}, "names split 'train' but the split given is 'test'"),
        ({"path": "data/problems.txt"}, "not a file of a known format"),
        ({"colums": "x"}, "unknown key 'dataset.colums'"),
    ],
)
def test_bad_sections_are_named(section, fragment):
    with pytest.raises(InvalidArgumentError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        config_from_dict(with_dataset(**{"path": "hf:org/x", **section}), source="job.yaml")


def test_a_section_built_directly_raises_a_typed_error():
    with pytest.raises(InvalidArgumentError, match="DatasetConfig: eval_fraction"):
        DatasetConfig(path="hf:org/x", eval_fraction=2)


def test_overrides_create_the_section(tmp_path):
    path = str(jsonl(tmp_path, [{"q": "p", "a": "1"}]))
    cfg = config_from_dict(BASE, [f"dataset.path={path}", "dataset.input_key=q", "dataset.label_key=a"])
    assert (cfg.dataset.path, cfg.dataset.input_key, cfg.dataset.label_key) == (path, "q", "a")


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"environment": {"difficulty": "hard"}}, "environment.difficulty is not read by a dataset job"),
        ({"environment": {"scenario": "debate"}}, "environment.scenario is not read by a dataset job"),
        ({"environment": {"reward_type": "sparse"}}, "environment.reward_type is not read by a dataset job"),
        (
            {"curriculum": {"enabled": True, "levels": ["easy", "hard"]}},
            "curriculum.enabled: a dataset job's rows",
        ),
    ],
)
def test_settings_a_dataset_job_would_not_read_are_refused(tmp_path, extra, named):
    """Keys only the built-in scenarios read would be accepted and do nothing in a dataset job (its env reads
    environment.max_turns and environment.options alone): refused at config load, naming the key."""
    data = jsonl(tmp_path, [{"prompt": "p", "answer": "a"}])
    assert (
        config_from_dict({**with_dataset(path=str(data)), "environment": {"max_turns": 1}}).dataset
        is not None
    )
    with pytest.raises(InvalidArgumentError, match=named):
        config_from_dict({**with_dataset(path=str(data)), **extra})


@pytest.mark.parametrize(
    ("key", "value", "owner", "owner_value"),
    [
        ("remote_timeout_s", 5.0, "remote_url", "http://127.0.0.1:1/get_reward"),
        ("remote_retries", 0, "remote_url", "http://127.0.0.1:1/get_reward"),
        ("remote_backoff_s", 0.1, "remote_url", "http://127.0.0.1:1/get_reward"),
        ("remote_batch_size", 8, "remote_url", "http://127.0.0.1:1/get_reward"),
        ("model_batch_size", 2, "model", "tiny-llama"),
        ("model_max_length", 512, "model", "tiny-llama"),
        ("judge_pattern", r"Grade: (\d)", "judge_agent", "b"),
        ("judge_pattern_timeout_s", 5.0, "judge_agent", "b"),
    ],
)
def test_a_reward_key_set_without_the_scorer_that_reads_it_is_refused(
    tmp_path, key, value, owner, owner_value
):
    """reward.remote_* without remote_url, reward.model_* without model and judge_pattern without judge_agent were
    accepted and did nothing; they are refused at config load, naming the key and the scorer it needs (with that
    scorer they load)."""
    data = jsonl(tmp_path, [{"prompt": "p", "answer": "a"}])
    with pytest.raises(InvalidArgumentError, match=rf"reward\.{key} is set but reward\.{owner} is not"):
        config_from_dict({**with_dataset(path=str(data)), "reward": {key: value}})
    reward = {key: value, owner: owner_value}
    assert RewardConfig(**reward).model_dump()[key] == value


def test_a_dataset_seed_nothing_reads_is_refused(tmp_path):
    """With shuffle false and no eval_fraction, dataset.seed seeds nothing: it was accepted and did nothing."""
    data = str(jsonl(tmp_path, [{"prompt": "p", "answer": "a"}]))
    with pytest.raises(InvalidArgumentError, match="dataset.seed is set but nothing reads it"):
        DatasetConfig(path=data, shuffle=False, seed=5)
    assert DatasetConfig(path=data, shuffle=False, eval_fraction=0.5, seed=5).seed == 5
    assert DatasetConfig(path=data, seed=5).seed == 5  # shuffle (the default) reads it
