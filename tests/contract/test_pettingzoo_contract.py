"""PettingZoo's own API and seed tests against in-process and remote envs (the same suite for both)."""

from __future__ import annotations

import warnings

import pytest
from pettingzoo.test import parallel_api_test, parallel_seed_test, seed_test
from pettingzoo.utils import parallel_to_aec

import marti.env.make as me
from marti.rpc.testing import serve_in_thread
from services.env_server.servicer import env_service
from services.env_server.settings import EnvServerSettings

CASES = {
    "resource_allocation": ("collaborative_task_solving", {}),
    "resource_allocation_json_hard": (
        "collaborative_task_solving",
        {"observation_format": "json", "difficulty": "hard", "reward_type": "sparse"},
    ),
    "debate": ("collaborative_task_solving", {"scenario": "debate", "num_agents": 4}),
    "dataset_task": (
        "dataset_task",
        {
            "rows": [
                {"prompt": "求 $\\frac{1}{2} + \\frac{1}{4}$ 的值。", "label": "0.75"},
                {"prompt": "Ünïcödé: 2 + 2 = ?", "label": 4},
            ],
            "agents": ["solver", "judge"],
            "max_turns": 3,
            "verifier": "numeric",
            "final": "majority",
        },
    ),
    "tictactoe_text": ("pettingzoo", {"entry_point": "pettingzoo.classic.tictactoe_v3:env", "text": True}),
    "connect_four": (
        "pettingzoo",
        {"entry_point": "pettingzoo.classic.connect_four_v3:env", "max_turns": 60},
    ),
    "rps_text": (
        "pettingzoo",
        {"entry_point": "pettingzoo.classic.rps_v2:parallel_env", "text": True, "max_turns": 20},
    ),
}


@pytest.fixture(scope="module")
def address():
    settings = EnvServerSettings(port=0)
    with serve_in_thread(lambda: [env_service(settings)], settings) as server:
        yield server.address


@pytest.fixture(params=["local", "remote"])
def where(request, address):
    return None if request.param == "local" else address


@pytest.mark.parametrize("case", sorted(CASES))
def test_pettingzoo_api_and_seed(case: str, where: str | None) -> None:
    env_id, cfg = CASES[case]

    def factory():
        return me.make(env_id, address=where, seed=0, **cfg)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = factory()
        parallel_api_test(env, num_cycles=60)
        env.close()
        parallel_seed_test(factory, num_cycles=60)
        seed_test(lambda: parallel_to_aec(factory()), num_cycles=60)
