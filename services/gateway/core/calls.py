"""The value types of the gateway facade (:class:`~services.gateway.core.gateway.Gateway`): what a request got,
what a report released, a servable model name, and the bookkeeping of calls in flight and of deliveries."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

from marti.types.inference import ChatMessages, Generation, SamplingParams, StaleCalls
from marti.types.trajectory import Trajectory
from services.gateway.core.traces import Released


@dataclass(frozen=True)
class ModelCard:
    """One servable model name.

    Attributes:
        id: ``agent`` (the current policy) or ``agent@VERSION`` (a resident version).
        agent: The agent.  version: Its policy version now (for ``agent``) or the pinned one.
        pinned: True for ``agent@VERSION`` names.
    """

    id: str
    agent: str
    version: int
    pinned: bool


@dataclass
class Served:
    """What one request got.

    Attributes:
        call_ids: One id per generation (per-call rewards name it).
        generations: ``n`` generations, each with its exact token ids, log-probs and policy version.
        agent: The agent that served it.
    """

    call_ids: list[str]
    generations: list[Generation]
    agent: str


@dataclass
class Reported(Released):
    """What a report released and dropped, and how many of its released episodes were not inserted yet.

    Attributes:
        queued: Released episodes of this report still waiting to be inserted into training when the report was
            answered (it waited ``gateway.report_wait_s`` seconds); they are inserted in the background, in
            order. 0 = every released episode was inserted (or there were none).
        stale: The released episodes' agents (and the reported episode's, when it is held for its group) whose
            calls are already past the staleness bound (empty when the gateway knows no bound).
    """

    queued: int = 0
    stale: list[StaleCalls] = field(default_factory=list)


@dataclass
class DeliveryBatch:
    """One report's released episodes on their way to the sink; ``left`` counts those not delivered yet,
    ``inserted`` / ``lost`` (not handed to the sink, or given up, because the gateway closed) / ``failed`` (the
    sink raised) name the episodes by outcome."""

    episodes: list[dict[str, Trajectory]]
    left: int = 0
    inserted: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    failed: list[tuple[str, Exception]] = field(default_factory=list)


@dataclass
class CallInFlight:
    """One traced call in flight: its task, whether its caller went away, and how many retries wait for it."""

    task: asyncio.Future[Served] | None = None
    caller_gone: bool = False
    waiters: int = 0
    fingerprint: tuple = ()


def fingerprint(
    model: str, prompt: ChatMessages | str | list[int], sampling: SamplingParams, n: int, group_id: str
) -> tuple:
    """What a retry under the same idempotency key must repeat: the model name, the prompt (token ids as
    given, raw text, or the chat messages), ``n``, every sampling parameter and the group id."""
    if isinstance(prompt, str):
        canon: object = ("text", prompt)
    elif prompt and isinstance(prompt[0], dict):
        canon = ("chat", json.dumps(prompt, sort_keys=True, default=repr))
    else:
        canon = ("ids", tuple(int(t) for t in prompt))  # type: ignore[union-attr]
    return (model, canon, n, repr(sampling), group_id)
