"""The ``gateway:`` and ``external:`` sections of the training config: the inference gateway that serves every
agent's policy to external agent code while the job trains (docs/gateway.md), and training on the episodes that
code reports.

The gateway's limits map onto ``services.gateway.core.limits.GatewayLimits``.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator, model_validator

from marti.config.section import NonNegFloat, PositiveFloat, PositiveInt, Section
from marti.types.tools import DEFAULT_TOOL_PARSER, TOOL_PARSER_NAMES


class GatewayConfig(Section):
    """The inference gateway: every agent's current policy served over OpenAI-compatible HTTP and gRPC while the
    job trains; calls made with an episode id are recorded (exact token ids, behaviour log-probs, policy
    version) and become training episodes when the client reports rewards (``rollout.source`` external or
    mixed). The limits map onto ``services.gateway.core.limits.GatewayLimits``."""

    enabled: bool = False
    """Start the gateway with the job (its addresses are printed and written to ``<run_dir>/gateway.json``).
    Forced on when ``rollout.source`` is ``external`` or ``mixed``. With ``rollout.source: builtin`` the
    gateway only serves: reported episodes are counted, never trained on."""
    host: str = "127.0.0.1"
    """Interface both endpoints bind; ``0.0.0.0`` for every interface."""
    http_port: Annotated[int, Field(ge=0, le=65535)] = 0
    """TCP port of the OpenAI-compatible HTTP endpoint (``/v1``); 0: any free port. A port another process
    holds is refused by ``marti train`` before anything starts (exit 2, naming the key and the port)."""
    grpc_port: Annotated[int, Field(ge=0, le=65535)] = 0
    """TCP port of the gRPC InferenceService; 0: any free port. Refused like ``http_port`` when another
    process holds it."""
    max_batch: PositiveInt = 32
    """Most prompts of one agent run in one engine call (concurrent requests are batched up to it)."""
    max_wait_ms: NonNegFloat = 5.0
    """Most milliseconds a request waits for others to fill its batch; a lone request (the engine idle, nothing
    else queued or being tokenized) does not wait."""
    max_queue: PositiveInt = 1024
    """Most prompts queued or running per agent; more are refused as overloaded (HTTP 429, gRPC
    RESOURCE_EXHAUSTED)."""
    max_n: PositiveInt = 16
    """Most completions one request may ask for (``n``)."""
    max_open_episodes: PositiveInt = 10_000
    """Most episodes with recorded calls and no reward report yet; a call that would open one more is refused as
    overloaded."""
    max_calls_per_episode: PositiveInt = 256
    """Most calls recorded per episode and agent; one more is refused (HTTP 400, gRPC INVALID_ARGUMENT)."""
    max_request_bytes: PositiveInt = 8 * 1024 * 1024
    """Largest HTTP request body and gRPC request message, bytes; larger ones are refused (HTTP 413, gRPC
    RESOURCE_EXHAUSTED)."""
    max_stop: PositiveInt = 16
    """Most stop strings one request may give."""
    max_stop_chars: PositiveInt = 256
    """Longest stop string, characters."""
    max_id_chars: PositiveInt = 256
    """Longest episode or group id, characters (ids may not contain ``/``)."""
    max_group_size: PositiveInt = 1024
    """Largest ``group_size`` a reward report may give; larger ones are refused (HTTP 400, gRPC
    INVALID_ARGUMENT)."""
    max_backlog_episodes: PositiveInt = 1024
    """Most released episodes waiting to be inserted into training (reports answered before their episodes were
    inserted, because the trainer is behind); a report whose released episodes (one, or the whole group it
    completes) would take the backlog above this is refused before it changes anything (HTTP 429 with
    Retry-After, gRPC RESOURCE_EXHAUSTED) and can be sent again later. Only a group larger than this exceeds it,
    taken while the backlog is empty."""
    report_wait_s: NonNegFloat = 5.0
    """Most seconds a reward report waits for its released episodes to be inserted into training; then it is
    answered as queued (HTTP 202, ``queued`` > 0) and they are inserted in the background."""
    linger_s: NonNegFloat = 0.0
    """Seconds the gateway keeps serving the trained policies after the last step (and its checkpoint), so
    clients can evaluate them, before the job ends; stopping the job ends it at once. 0: the job ends at once."""
    resident_versions: PositiveInt | None = None
    """Policy versions per agent that can be requested as ``agent@VERSION`` (the current one included): the
    serving actor keeps a CPU copy of the last this many synced weights of every agent (the LoRA adapter or the
    whole state dict) and loads an older one for the duration of a call; 1 keeps no copy. Null: the largest
    staleness bound of any agent plus 1. The vLLM engine serves only the current version."""

    max_tools_chars: PositiveInt = 65_536
    """Longest ``tools`` of one request (chat ``tools``, Responses ``tools``, Anthropic ``tools``), characters of
    its JSON; longer ones are refused (HTTP 400 naming ``tools``)."""
    max_stored_responses: PositiveInt = 256
    """Most Responses API responses (``POST /v1/responses`` with ``store``, the default) kept per episode for a
    later ``previous_response_id``, and as many for untraced calls; the oldest is forgotten first (its id is then
    unknown: 404), and an episode's are freed when it is reported or abandoned."""
    tool_parser: str = DEFAULT_TOOL_PARSER
    """How every agent's tool calls are read from its replies, by chat-template family (vLLM's
    ``--tool-call-parser``): ``hermes`` reads ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
    (Hermes, Qwen 2.5 / 3), ``mistral`` reads ``[TOOL_CALLS][{"name": ..., "arguments": {...}}]`` (Mistral v0.3,
    Mixtral, Nemo). An agent's template without tool support gets this parser's format rendered into the prompt
    (docs/gateway.md, "Tools")."""
    tool_parsers: dict[str, str] = Field(default_factory=dict)
    """Per agent, a tool parser other than ``tool_parser`` (agent name -> parser name), for teams of agents on
    different base models."""

    @field_validator("tool_parser")
    @classmethod
    def _known_parser(cls, value: str) -> str:
        if value not in TOOL_PARSER_NAMES:
            raise ValueError(f"unknown tool parser {value!r}; known parsers: {list(TOOL_PARSER_NAMES)}")
        return value

    @field_validator("tool_parsers")
    @classmethod
    def _known_parsers(cls, value: dict[str, str]) -> dict[str, str]:
        for agent, name in value.items():
            if name not in TOOL_PARSER_NAMES:
                raise ValueError(
                    f"agent {agent!r}: unknown tool parser {name!r}; known parsers: {list(TOOL_PARSER_NAMES)}"
                )
        return value

    @model_validator(mode="after")
    def _check(self) -> GatewayConfig:
        if self.http_port and self.http_port == self.grpc_port:
            raise ValueError(f"gateway.http_port and gateway.grpc_port are both {self.http_port}")
        return self


class ExternalConfig(Section):
    """Training on episodes external agent code plays through the inference gateway (``rollout.source``
    external or mixed)."""

    episodes_per_step: PositiveInt = 8
    """Items each trainable agent's update takes from its table per step beyond the built-in episodes: one
    per episode an external client reported (``rollout.source`` external or mixed)."""
    episode_timeout_s: PositiveFloat = 600.0
    """Seconds after its last call an open external episode without a reward report is abandoned: dropped with
    its group, never trained on (counted in ``gateway/abandoned`` and ``gateway/dropped``). Applies whenever
    the gateway runs."""
    wait_timeout_s: PositiveFloat = 600.0
    """Most seconds an update waits for its external episodes (``rollout.source`` external or mixed); the job
    then fails with an error naming how many items arrived of how many needed."""
