"""Routing through the gateway with LoRA adapters: each agent's calls reach its own adapter and version, and an
agent's update never changes another agent's outputs.

Comparable gateways were reported to serve the base model instead of the adapter. Here two agents are LoRA
adapters on one shared tiny base model (``examples/tiny.yaml``, ``policy.mode: lora``), served by a policy worker
(the actor class a job runs) behind :class:`~services.trainer.rollout.gateway_backend.TrainerBackend`, a
:class:`~services.gateway.server.GatewayServer` and the official ``openai`` client. Every greedy answer is
compared with a fresh engine loaded with exactly that agent's weights of that version.
"""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
import torch

from marti.config import load_config
from marti.inference import SamplingParams
from services.gateway.core.gateway import Gateway
from services.gateway.core.limits import GatewayLimits
from services.gateway.server import GatewayServer
from services.trainer.models.loading import load_tokenizer
from services.trainer.models.policy import MultiAgentPolicy
from services.trainer.ray.policy_worker import PolicyWorker, policy_actor_config, policy_layout
from services.trainer.rollout.gateway_backend import TrainerBackend
from services.trainer.rollout.hf import HFRolloutEngine
from tests.trainer_data import one_turn

ROOT = Path(__file__).resolve().parents[3]
TOKEN = "routing-token"
AGENTS = ("agent_1", "agent_2")
PROMPT = [1, 450, 3303, 318, 2061, 1110]
MAX_TOKENS = 6


class _Runtime:
    """What :class:`TrainerBackend` needs of a job's runtime, over one policy worker in this process."""

    def __init__(self, worker: PolicyWorker) -> None:
        self.worker = worker

    def serve(self, agent, prompts, sampling, version):
        return self.worker.serve(agent, prompts, sampling, version)

    def serving_state(self):
        return self.worker.serving_state()


def _reference(
    cfg, agent: str, weights: dict[str, torch.Tensor], version: int
) -> tuple[list[int], list[float]]:
    """The greedy answer to PROMPT of a fresh engine loaded with ``weights`` for ``agent``."""
    policy = MultiAgentPolicy(policy_layout(cfg), device="cpu")
    engine = HFRolloutEngine.from_policy(policy, copy_weights=True)
    engine.update_weights(agent, weights, version)
    with torch.no_grad():
        (g,) = engine.generate(agent, [PROMPT], SamplingParams(max_new_tokens=MAX_TOKENS, temperature=0.0))
    return list(g.response_token_ids), list(g.response_logprobs)


def _update(worker: PolicyWorker, agent: str) -> None:
    """One training step of ``agent`` on a group whose rewards differ (so its adapter moves)."""
    gens = worker.serve(agent, [PROMPT] * 4, SamplingParams(max_new_tokens=4, seed=1), None)
    samples = [
        one_turn(g.prompt_token_ids, g.response_token_ids, float(i % 2), 0, list(g.response_logprobs))
        for i, g in enumerate(gens)
    ]
    worker.train(agent, samples)


def _answer(client: openai.OpenAI, model: str) -> tuple[list[int], list[float], int]:
    r = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0.0, logprobs=1, stop=[]
    )
    c = r.choices[0]
    return c.model_extra["token_ids"], c.logprobs.token_logprobs, r.model_extra["policy_version"]


def _apart(a: tuple[list[int], list[float], int], b: tuple[list[int], list[float], int]) -> bool:
    """Two greedy answers differ in their tokens or, beyond noise, their log-probabilities."""
    return a[0] != b[0] or max(abs(x - y) for x, y in zip(a[1], b[1], strict=True)) > 1e-4


def _same(got: tuple[list[int], list[float], int], want: tuple[list[int], list[float]]) -> bool:
    return got[0] == want[0] and got[1] == pytest.approx(want[1], abs=1e-4)


def test_each_agents_calls_reach_its_own_adapter_and_an_update_leaves_the_other_agent_unchanged():
    cfg = load_config(
        ROOT / "examples" / "tiny.yaml",
        [
            "gateway.enabled=true",
            "gateway.resident_versions=2",
            "learning_rate=0.05",
            "rollout.max_new_tokens=4",
        ],
    )
    assert cfg.policy.mode == "lora" and list(AGENTS) == [a.name for a in cfg.agents]
    worker = PolicyWorker(policy_actor_config(cfg), num_threads=1)
    tok = load_tokenizer()
    backend = TrainerBackend(_Runtime(worker), list(AGENTS), {a: tok for a in AGENTS})
    server = GatewayServer(Gateway(backend, GatewayLimits(max_wait_ms=1, resident_versions=2)), token=TOKEN)
    http_url, _ = server.start()
    try:
        client = openai.OpenAI(base_url=http_url, api_key=TOKEN, max_retries=0, timeout=120)
        v0 = {a: _answer(client, a) for a in AGENTS}
        for a in AGENTS:
            assert v0[a][2] == 0 and _same(v0[a], _reference(cfg, a, worker.weights_for_sync(a)[0], 0)), a

        # agent_1's update: its calls now reach its new adapter; agent_1@0 its old one; agent_2 is untouched
        w1 = worker.weights_for_sync("agent_1")[0]
        w1 = {k: t.clone() for k, t in w1.items()}
        _update(worker, "agent_1")
        backend.refresh()  # what the job does after every step's syncs
        new = worker.weights_for_sync("agent_1")[0]
        assert any(not torch.equal(w1[k], new[k]) for k in new), "the update did not move agent_1's adapter"
        one = {a: _answer(client, a) for a in AGENTS}
        assert one["agent_1"][2] == 1 and _apart(one["agent_1"], v0["agent_1"]), (
            "agent_1 still serves version 0"
        )
        assert _same(one["agent_1"], _reference(cfg, "agent_1", new, 1)), (
            "agent_1 is not served its own adapter"
        )
        assert one["agent_2"] == v0["agent_2"], "agent_1's update changed agent_2's outputs"
        assert _apart(one["agent_1"], one["agent_2"]), "the test could not tell the two adapters apart"
        pinned = _answer(client, "agent_1@0")
        assert pinned[2] == 0 and _same(pinned, _reference(cfg, "agent_1", w1, 0))

        # agent_2's update: the same the other way round
        _update(worker, "agent_2")
        backend.refresh()
        two = {a: _answer(client, a) for a in AGENTS}
        assert two["agent_2"][2] == 1 and _apart(two["agent_2"], v0["agent_2"])
        assert _same(two["agent_2"], _reference(cfg, "agent_2", worker.weights_for_sync("agent_2")[0], 1))
        assert two["agent_1"] == one["agent_1"], "agent_2's update changed agent_1's outputs"
        assert [m.id for m in client.models.list().data] == ["agent_1", "agent_1@0", "agent_1@1", "agent_2",
                                                            "agent_2@0", "agent_2@1"]  # fmt: skip
    finally:
        server.stop()
