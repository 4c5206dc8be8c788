"""The task, rewards and training loop shared by the agent-framework examples: no marti import in this file.

Both apps (``examples/agents_sdk/app.py``, OpenAI Agents SDK; ``examples/langgraph/app.py``, LangGraph) play the
same two-agent task with their own framework: a ``router`` hands an arithmetic question off to a ``calculator``
(a call of the tool ``transfer_to_calculator``, no arguments), and the calculator calls ``add(a, b)`` with the two
numbers of the question. Each agent is its own model name on the gateway, so each is trained as its own policy.

The checkable reward of each agent is whether its call was right (:func:`rewards`):

- ``router``: 1 when it called ``transfer_to_calculator`` with no arguments (``{}``, the tool's schema), else 0;
- ``calculator``: 1 when it called ``add`` with ``a`` and ``b`` the question's two numbers in order, else 0.

A reply that is no such call (text, a call of a tool the agent does not have, a reply cut at ``max_tokens``) scores 0.
Each agent's conversation starts with one worked example of its own call (:data:`EXAMPLE_QUESTION`), the usual
few-shot help for a small model, and every call is made with ``tool_choice="required"`` and one call at most.

An app gives :func:`main` its ``play(base_url, api_key, pair, question, temperature, max_tokens)`` coroutine,
which returns each agent's calls as ``{agent: [(tool name, parsed arguments), ...]}``. :func:`main` does the rest:
training episodes (one ``base_url`` per episode, ``<gateway>/episodes/<id>/groups/<group>/v1``, and one HTTP POST
of the rewards per episode) or held-out evaluation (nothing recorded).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
import urllib.request
import uuid
from collections.abc import Awaitable, Callable

AGENTS = ("router", "calculator")
PHRASES = ["What is {a} plus {b}?", "Add {a} and {b}.", "What do you get when you add {a} and {b}?"]
#: Held-out number pairs: never a training pair (:func:`train_pairs` leaves them out).
HELD_OUT = [(14, 29), (36, 7), (8, 45), (23, 16), (51, 12), (9, 38), (27, 44), (6, 19)]
#: The worked example each agent's conversation starts with: the question, then the agent's own right call, its
#: result, and the team's answer.
EXAMPLE_QUESTION = "What is 5 plus 8?"
EXAMPLE_CALLS = {"router": ("transfer_to_calculator", {}), "calculator": ("add", {"a": 5, "b": 8})}
EXAMPLE_RESULTS = {"router": '{"assistant": "calculator"}', "calculator": "13"}
EXAMPLE_ANSWER = "13"
INSTRUCTIONS = {
    "router": "You are a triage agent. Hand every question to the calculator.",
    "calculator": "You are a calculator. Call the add tool with the two numbers of the question.",
}

Calls = dict[str, list[tuple[str, object]]]
Play = Callable[[str, str, tuple[int, int], str, float, int], Awaitable[Calls]]


def train_pairs(seed: int, count: int) -> list[tuple[int, int]]:
    """``count`` seeded training number pairs (2..60 each), none of them held out."""
    rng = random.Random(seed)
    pairs: list[tuple[int, int]] = []
    while len(pairs) < count:
        pair = (rng.randint(2, 60), rng.randint(2, 60))
        if pair not in HELD_OUT:
            pairs.append(pair)
    return pairs


def arguments(text: str) -> object:
    """A call's arguments (JSON text) parsed, or None when they are not JSON."""
    try:
        return json.loads(text)
    except ValueError:
        return None


def rewards(calls: Calls, pair: tuple[int, int]) -> dict[str, float]:
    """1.0 for each agent that made its right call: the router's handoff with ``{}``, the calculator's ``add``
    of the question's two numbers in order; else 0.0."""
    right = {"router": ("transfer_to_calculator", {}), "calculator": ("add", {"a": pair[0], "b": pair[1]})}
    return {a: float(right[a] in calls.get(a, ())) for a in AGENTS}


def report(gateway: str, api_key: str, episode: str, got: dict[str, float], group: str, size: int) -> None:
    """POST the episode's rewards to the gateway (ends the episode; it becomes training data)."""
    body = json.dumps({"rewards": got, "group_id": group, "group_size": size}).encode()
    req = urllib.request.Request(
        f"{gateway.rstrip('/')}/episodes/{episode}/reward",
        data=body,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        resp.read()


def wait_for_version(gateway: str, api_key: str, version: int, timeout_s: float = 1800.0) -> None:
    """Wait until every model the gateway lists (``GET /v1/models``) has policy version ``version``."""
    deadline = time.monotonic() + timeout_s
    req = urllib.request.Request(
        f"{gateway.rstrip('/')}/models", headers={"Authorization": f"Bearer {api_key}"}
    )
    while True:
        with urllib.request.urlopen(req, timeout=60) as resp:
            models = json.load(resp)["data"]
        versions = [m.get("policy_version", 0) for m in models if "@" not in m["id"]]
        if versions and min(versions) >= version:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"policy versions {versions} did not reach {version} within {timeout_s:.0f}s")
        time.sleep(1.0)


async def evaluate(play: Play, args: argparse.Namespace) -> dict[str, float]:
    """Valid-call rate of each agent over the held-out pairs (``--eval-samples`` each), recording nothing."""
    limit = asyncio.Semaphore(args.concurrency)

    async def one(i: int, pair: tuple[int, int]) -> dict[str, float]:
        question = PHRASES[i % len(PHRASES)].format(a=pair[0], b=pair[1])
        async with limit:
            calls = await play(args.gateway, args.api_key, pair, question, args.temperature, args.max_tokens)
        return rewards(calls, pair)

    jobs = [(i + s, pair) for i, pair in enumerate(HELD_OUT) for s in range(args.eval_samples)]
    results = await asyncio.gather(*(one(i, pair) for i, pair in jobs))
    return {a: sum(r[a] for r in results) / len(results) for a in AGENTS}


async def train(play: Play, args: argparse.Namespace) -> dict[str, float]:
    """Play and report the training episodes, one round per update, each round once every policy has the version
    of the updates before it (``GET /v1/models``): every round is played on-policy; return each agent's mean
    reward."""
    root = args.gateway.rstrip("/").removesuffix("/v1")
    pairs = train_pairs(args.seed, args.rounds * args.episodes_per_round // args.group_size)
    limit = asyncio.Semaphore(args.concurrency)

    async def episode(n: int) -> dict[str, float]:
        q = n // args.group_size
        group, eid, pair = f"q{q}-{args.seed}", uuid.uuid4().hex, pairs[q]
        question = PHRASES[q % len(PHRASES)].format(a=pair[0], b=pair[1])
        base = f"{root}/episodes/{eid}/groups/{group}/v1"
        async with limit:
            got = rewards(
                await play(base, args.api_key, pair, question, args.temperature, args.max_tokens), pair
            )
        await asyncio.to_thread(report, args.gateway, args.api_key, eid, got, group, args.group_size)
        if args.verbose:
            print(f"{group} {question!r}: {got}", flush=True)
        return got

    totals = dict.fromkeys(AGENTS, 0.0)
    for rnd in range(args.rounds):
        # on-policy rounds: round ``rnd`` is played by policy version ``rnd`` (the weights of update ``rnd``), and
        # update ``rnd + 1`` trains on it alone (the configs' ``max_staleness: 0`` drops anything older)
        await asyncio.to_thread(wait_for_version, args.gateway, args.api_key, rnd)
        first = rnd * args.episodes_per_round
        for got in await asyncio.gather(*(episode(first + i) for i in range(args.episodes_per_round))):
            for a in AGENTS:
                totals[a] += got[a] / (args.rounds * args.episodes_per_round)
    return totals


def main(play: Play, description: str, argv: list[str] | None = None) -> int:
    """Parse the command line, then play training episodes (grouped by question) or evaluate on held-out
    questions with ``play``; print each agent's valid-call rate as ``router=R calculator=R``."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--gateway", required=True, help="the gateway's OpenAI base URL, http://HOST:PORT/v1")
    p.add_argument("--api-key", default=os.environ.get("MARTI_TOKEN") or "none")
    p.add_argument("--rounds", type=int, default=3, help="rounds of training episodes (one per update)")
    p.add_argument("--episodes-per-round", type=int, default=24, help="a multiple of --group-size")
    p.add_argument("--group-size", type=int, default=8, help="episodes per question (a GRPO group)")
    p.add_argument("--seed", type=int, default=0, help="which training questions are drawn")
    p.add_argument(
        "--temperature", type=float, default=0.7, help="sampling temperature, also when evaluating"
    )
    p.add_argument("--max-tokens", type=int, default=40, help="per call (a right call of add takes 29)")
    p.add_argument("--evaluate", action="store_true", help="held-out questions, nothing recorded")
    p.add_argument("--eval-samples", type=int, default=3, help="episodes per held-out question")
    p.add_argument("--wait-version", type=int, default=0, help="first wait until every policy has it")
    p.add_argument("--concurrency", type=int, default=32, help="episodes played at once (batched)")
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args(argv)
    if args.wait_version:
        wait_for_version(args.gateway, args.api_key, args.wait_version)
    rates = asyncio.run(evaluate(play, args) if args.evaluate else train(play, args))
    print(" ".join(f"{a}={r:.3f}" for a, r in rates.items()), flush=True)
    return 0
