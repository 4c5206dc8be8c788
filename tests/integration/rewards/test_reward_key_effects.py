"""Each key of the ``reward:`` section changes how a dataset job's replies are scored, through the trainer's own
path: :func:`services.trainer.rollout.episodes.scoring.build_scorer` on a validated config, a real HTTP reward server on
port 0, and the reward-model actor class :class:`~services.trainer.ray.reward_worker.RewardModelWorker` built
in-process from :func:`~services.trainer.ray.reward_worker.reward_actor_config` (the ``tiny-llama`` alias: a tiny
random one-label classifier), without Ray (tests/unit/config/key_walk_tables.py maps every ``reward.*`` key here, for the key walk of test_key_walk.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from marti.config import config_from_dict
from marti.config.sections.reward import RewardConfig
from marti.errors import MartiError
from services.trainer.ray.reward_worker import RewardModelWorker, reward_actor_config
from services.trainer.rollout.episodes.scoring import build_scorer
from tests.integration.rewards.test_remote_rewards import Server, length_reward

#: Three replies to two problems; the last two texts differ only at their start (``model_max_length``).
PROMPTS = ["What is 2+2?", "Alpha beta gamma delta:", "Zeta eta theta iota:"]
COMPLETIONS = [" 4", " the same ending of every text", " the same ending of every text"]
COLUMNS = {"prompt": PROMPTS, "answer": ["4", "5", "6"]}

FUNCTIONS = """
def by_length(prompts, completions, **columns):
    return [float(len(c)) for c in completions]


def is_four(prompts, completions, answer, **columns):
    return [float(c.strip() == "4") for c in completions]
"""

#: key -> (settings on both sides, the changed value). ``file:NAME`` names a function of :data:`FUNCTIONS`,
#: ``server:KIND`` a server of the ``servers`` fixture.
CHANGES: dict[str, tuple[dict[str, Any], Any]] = {
    "functions": ({"functions": ["file:by_length"]}, ["file:is_four"]),
    "function_weights": ({"functions": ["file:by_length"]}, [3.0]),
    "remote_url": ({}, "server:length"),
    "remote_timeout_s": ({"remote_url": "server:slow", "remote_retries": 0}, 0.2),
    "remote_retries": ({"remote_url": "server:flaky", "remote_backoff_s": 0.0}, 0),
    "remote_backoff_s": ({"remote_url": "server:flaky", "remote_backoff_s": 0.0}, 0.4),
    "remote_batch_size": ({"remote_url": "server:length"}, 1),
    "model": ({}, "tiny-llama"),
    "model_batch_size": ({"model": "tiny-llama"}, 1),
    "model_max_length": ({"model": "tiny-llama"}, 4),
}


#: The judge's keys score through the judge's verdict, not build_scorer (tests/unit/trainer/data/test_data_workflows.py).
JUDGE_KEYS = ("judge_agent", "judge_pattern", "judge_pattern_timeout_s")


def test_the_table_names_every_key():
    assert sorted(CHANGES) == sorted(k for k in RewardConfig.model_fields if k not in JUDGE_KEYS)


@pytest.fixture
def servers() -> Iterator[dict[str, Server]]:
    """``length``: reward = the query's length; ``slow``: answers after 1 s; ``flaky``: a 503 first, then as
    ``length`` (its ``stamps``: when each request came)."""

    def slow(n: int, body: dict) -> tuple[int, bytes]:
        made["slow"].release.wait(1.0)
        return length_reward(n, body)

    def flaky(n: int, body: dict) -> tuple[int, bytes]:
        stamps.append(time.monotonic())
        return (503, b"busy") if n == 0 else length_reward(n, body)

    stamps: list[float] = []
    made = {name: Server(b) for name, b in (("length", length_reward), ("slow", slow), ("flaky", flaky))}
    made["flaky"].stamps = stamps
    yield made
    for server in made.values():
        server.stop()


def _resolve(value: Any, tmp_path: Path, servers: dict[str, Server]) -> Any:
    if isinstance(value, list):
        return [_resolve(v, tmp_path, servers) for v in value]
    if isinstance(value, str) and value.startswith("file:"):
        return f"{tmp_path / 'rewards.py'}:{value[5:]}"
    if isinstance(value, str) and value.startswith("server:"):
        return servers[value[7:]].url
    return value


def _outcome(section: dict[str, Any], tmp_path: Path, servers: dict[str, Server]) -> tuple:
    """What scoring :data:`PROMPTS` gives under ``section``: the scores (None: no scorer; or the error's class),
    each server's request sizes, whether the flaky server's retry came 0.3 s or more after its first request,
    and the reward model's forward passes."""
    for server in servers.values():
        server.bodies.clear()
    servers["flaky"].stamps.clear()
    cfg = config_from_dict(
        {
            "training_name": "t",
            "agents": [{"name": "a", "pretrain_model": "tiny-llama", "role": "solver"}],
            "dataset": {"path": f"json:{tmp_path / 'rows.json'}"},
            "reward": section,
        }
    )
    forwards: list[int] = []
    score_model = None
    if cfg.reward.model:  # the actor class, in this process
        worker = RewardModelWorker(reward_actor_config(cfg), num_threads=1)
        worker.scorer.model.register_forward_hook(lambda *_: forwards.append(1))
        score_model = worker.score
    scorer = build_scorer(cfg, score_model)
    try:
        scores: Any = scorer and [round(s, 4) for s in scorer.score(PROMPTS, COMPLETIONS, COLUMNS)]
    except MartiError as exc:
        scores = type(exc).__name__
    sizes = {name: [len(b["query"]) for b in s.bodies] for name, s in servers.items() if s.bodies}
    stamps = servers["flaky"].stamps
    waited = len(stamps) > 1 and stamps[1] - stamps[0] >= 0.3
    return scores, sizes, waited, len(forwards)


@pytest.mark.parametrize("key", sorted(CHANGES))
def test_each_reward_key_changes_the_scores(tmp_path, servers, key):
    (tmp_path / "rewards.py").write_text(FUNCTIONS)
    (tmp_path / "rows.json").write_text(
        json.dumps([{"prompt": p, "answer": a} for p, a in zip(PROMPTS, "456", strict=True)])
    )
    context, value = CHANGES[key]
    base = {k: _resolve(v, tmp_path, servers) for k, v in context.items()}
    changed = {**base, key: _resolve(value, tmp_path, servers)}
    assert _outcome(changed, tmp_path, servers) != _outcome(base, tmp_path, servers)
