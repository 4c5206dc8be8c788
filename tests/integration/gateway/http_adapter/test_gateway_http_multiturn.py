"""Multi-turn chat calls that extend the previous one merge into one turn under the real chat template."""

from __future__ import annotations

import httpx
import openai

from marti.types.inference import Generation
from services.gateway.core.gateway import Gateway
from services.gateway.core.limits import GatewayLimits
from services.gateway.server import GatewayServer
from services.trainer.models.loading import load_tokenizer
from services.trainer.rollout.engines.base import chat_to_ids
from tests.integration.gateway.http_adapter.http_gateway import (
    TOKEN,
    FixedBackend,
    auth,
)

REPLY = "Sure, first we pack the bags."


class _ChatBackend(FixedBackend):
    """Agent ``a`` with the tiny model's tokenizer and its real (SmolLM2) chat template, and no model: every
    completion is :data:`REPLY`, as its canonical token ids, then eos; with stop strings it continues with
    ``" STOP now"`` and is cut as the engine cuts it (the ids keep the token completing the stop string, the
    text ends before it)."""

    def chat_prompt(self, agent, messages) -> list[int]:
        return chat_to_ids(self.tok, messages)

    def generate(self, agent, prompts, sampling, version) -> list[Generation]:
        if sampling.stop:
            text = REPLY + " STOP now"
            ids = self.encode(agent, text)
            end = next(k for k in range(1, len(ids) + 1) if "STOP" in self.decode(agent, ids[:k]))
            ids, text, reason = ids[:end], REPLY + " ", "stop"
        else:
            ids, text, reason = self.encode(agent, REPLY) + [self.tok.eos_token_id], REPLY, "stop"
        return [Generation(list(p), list(ids), [-0.5] * len(ids), text, reason, 0, agent) for p in prompts]


def test_chat_calls_that_extend_the_previous_one_merge_into_one_turn_under_the_real_chat_template():
    """Consecutive chat calls of one agent whose prompt renders the previous call's reply (the conversation goes
    on) become one turn: the template's markup and the new user message between the two replies are in its
    response with mask 0. A call with another conversation starts a turn of its own, and so does one after a
    stop string cut the previous reply's text (the history no longer renders the sampled ids)."""
    tok = load_tokenizer()
    sink: list = []
    server = GatewayServer(
        Gateway(_ChatBackend(tok), GatewayLimits(max_wait_ms=1), sink=sink.append), token=TOKEN
    )
    http_url, _ = server.start()
    try:
        root = http_url.removesuffix("/v1")

        def episode(eid: str, stop: list[str]) -> list:
            client = openai.OpenAI(
                base_url=f"{root}/episodes/{eid}/v1", api_key=TOKEN, max_retries=0, timeout=30
            )
            first = [{"role": "user", "content": "Plan the trip."}]
            r1 = client.chat.completions.create(model="a", messages=first, max_tokens=32, stop=stop)
            said = r1.choices[0].message.content
            more = [*first, {"role": "assistant", "content": said}, {"role": "user", "content": "And then?"}]
            r2 = client.chat.completions.create(model="a", messages=more, max_tokens=32, stop=stop)
            r3 = client.chat.completions.create(
                model="a", messages=[{"role": "user", "content": "Something else."}], max_tokens=32, stop=stop
            )
            rep = httpx.post(
                f"{http_url}/episodes/{eid}/reward", json={"rewards": {"a": 1.0}}, headers=auth()
            )
            assert rep.status_code == 200, rep.text
            return [r1, r2, r3, sink[-1]["a"]]

        r1, r2, r3, traj = episode("merged", [])
        assert r1.choices[0].message.content == REPLY
        p1, p2 = r1.model_extra["prompt_token_ids"], r2.model_extra["prompt_token_ids"]
        ids1, ids2 = r1.choices[0].model_extra["token_ids"], r2.choices[0].model_extra["token_ids"]
        gap = p2[len(p1) + len(ids1) :]
        assert p2[: len(p1) + len(ids1)] == p1 + ids1 and gap  # the template re-rendered the sampled ids
        merged, alone = traj.turns
        assert merged.prompt_token_ids == p1 and merged.response_token_ids == ids1 + gap + ids2
        assert merged.response_mask == [1] * len(ids1) + [0] * len(gap) + [1] * len(ids2)
        assert merged.response_logprobs == [-0.5] * len(ids1) + [0.0] * len(gap) + [-0.5] * len(ids2)
        assert "And then?" in tok.decode(gap)
        assert alone.prompt_token_ids == r3.model_extra["prompt_token_ids"]
        assert alone.response_token_ids == r3.choices[0].model_extra["token_ids"]

        *_, cut = episode("cut", ["STOP"])
        assert len(cut.turns) == 3 and all(set(t.response_mask) == {1} for t in cut.turns)
    finally:
        server.stop()
