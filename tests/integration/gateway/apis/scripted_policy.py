"""A scripted policy for the chat protocols' tool tests (Anthropic Messages, Responses): the tiny model's tokenizer
and its real SmolLM2 chat template, no model. That template does not render tools, so the gateway's Hermes
fallback format puts them in the prompt; the policy answers a prompt that lists tools with a Hermes call of
``get_weather`` (:data:`CALL`; or the rest of one, when the prompt was prefilled with its start), a prompt holding a
tool's result with :data:`ANSWER`, anything else with :data:`REPLY`; with stop strings it goes on with
``" STOP now"`` and is cut as the engine cuts it.
"""

from __future__ import annotations

import json

from marti.types.inference import Generation
from services.gateway.core.backend import InferenceBackend
from services.trainer.models.loading import load_tokenizer
from services.trainer.rollout.serving.gateway_backend import _Tokenizers
from tests.integration.gateway.one_agent import OneAgent

REPLY = "Hello from the policy."
ANSWER = "It is sunny in Paris."
CALL = {"name": "get_weather", "arguments": {"city": "Paris"}}


class ScriptedToolPolicy(OneAgent, _Tokenizers, InferenceBackend):
    """Agent ``a``: the tiny model's tokenizer and chat template (the text side of the gateway's own backends),
    replies scripted from the prompt's text."""

    context = 4096

    def __init__(self) -> None:
        self.tok = load_tokenizer()
        self.tokenizers = {"a": self.tok}

    def _text(self, prompt: str) -> str:
        call = json.dumps(CALL)
        if prompt.endswith(
            '"arguments": '
        ):  # tool_choice named the function: the prompt holds the call's start
            return json.dumps(CALL["arguments"]) + "}\n</tool_call>"
        if prompt.endswith("<tool_call>\n"):  # tool_choice any
            return call + "\n</tool_call>"
        if "<tool_response>" in prompt:
            return ANSWER
        return f"<tool_call>\n{call}\n</tool_call>" if "<tools>" in prompt else REPLY

    def generate(self, agent, prompts, sampling, version) -> list[Generation]:
        out = []
        for p in prompts:
            text = self._text(self.tok.decode(p))
            reason = "stop"
            if (
                sampling.stop and text == REPLY
            ):  # cut as the engine cuts: the ids keep the token completing it
                ids = self.encode(agent, REPLY + " STOP now")
                end = next(k for k in range(1, len(ids) + 1) if "STOP" in self.decode(agent, ids[:k]))
                ids, text = ids[:end], REPLY + " "
            else:
                ids = self.encode(agent, text) + [self.tok.eos_token_id]
            if len(ids) > sampling.max_new_tokens:
                ids, reason = ids[: sampling.max_new_tokens], "length"
                text = self.decode(agent, ids)
            out.append(Generation(list(p), ids, [-0.5] * len(ids), text, reason, 0, agent))
        return out
