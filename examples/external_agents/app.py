"""A two-agent team written only against the ``openai`` package: no marti import anywhere in this file.

The team answers yes/no questions. ``alice`` answers first; ``bob`` reads her answer and replies. Each agent is its
own model on the gateway (``model="alice"``, ``model="bob"``), so each is trained as its own policy. The checkable
reward of this toy team: alice scores 1 when her reply starts with "yes", bob scores 1 when his starts with "no"
(different targets per agent, so serving one agent's policy for the other would show).

The only training-specific parts are the ``base_url`` (``<gateway>/episodes/<episode id>/groups/<group id>/v1``:
the gateway records the calls under that episode, grouped by question for GRPO) and one HTTP POST of the rewards
when the episode ends (``/v1/episodes/<id>/reward``). Anything that speaks the OpenAI API (LangGraph, AutoGen, a
Node service) can do the same.

Usage::

    python app.py --gateway http://127.0.0.1:8000/v1 --rounds 3 --episodes-per-round 48   # training episodes
    python app.py --gateway http://127.0.0.1:8000/v1 --evaluate                       # held-out, greedy
    python app.py --gateway http://127.0.0.1:8000/v1 --evaluate --wait-version 3      # after 3 updates

Training plays ``--rounds`` rounds of ``--episodes-per-round`` episodes (the job's ``max_steps`` and
``external.episodes_per_step``), starting round ``r`` once every policy serves version ``r`` (the weights of the
``r`` updates before it), so each update trains on a round its own weights played (on-policy; the config's
``rollout.max_staleness: 0`` drops anything older). Prints one line per episode (``--verbose``) and at the end
``alice=R bob=R``, the mean rewards.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor

import openai

TRAIN_QUESTIONS = [
    "Is water wet?", "Is the sun cold?", "Can fish fly?", "Is ice hot?", "Do cats bark?",
    "Is grass green?", "Is two more than one?", "Can birds swim?", "Is snow white?", "Do trees walk?",
    "Is the moon made of cheese?", "Can dogs read?",
]  # fmt: skip
HELD_OUT_QUESTIONS = [
    "Is fire cold?", "Do cows fly?", "Is the sea salty?", "Can stones sing?", "Is milk white?",
    "Do fish breathe air?",
]  # fmt: skip
TARGETS = {"alice": "yes", "bob": "no"}


def reward(agent: str, reply: str) -> float:
    """1.0 when the reply's first word is the agent's target word, else 0.0."""
    words = reply.strip().lower().replace(",", " ").replace(".", " ").split()
    return 1.0 if words and words[0] == TARGETS[agent] else 0.0


def play(
    gateway: str, api_key: str, question: str, *, episode: str | None, group: str, greedy: bool
) -> dict[str, float]:
    """One episode of the team: alice answers, bob replies to her. Returns each agent's reward.

    With ``episode`` the calls are recorded under it (training); without, they are only served (evaluation).
    """
    root = gateway.rstrip("/").removesuffix("/v1")
    base = f"{root}/episodes/{episode}/groups/{group}/v1" if episode else f"{root}/v1"
    client = openai.OpenAI(base_url=base, api_key=api_key, max_retries=2)
    sampling = {"temperature": 0.0} if greedy else {"temperature": 1.0}
    alice = client.chat.completions.create(
        model="alice",
        messages=[
            {"role": "system", "content": "Answer with one word: yes or no."},
            {"role": "user", "content": question},
        ],
        max_tokens=4,
        **sampling,
    )
    said = alice.choices[0].message.content or ""
    bob = client.chat.completions.create(
        model="bob",
        messages=[
            {"role": "system", "content": "You review a teammate's answer. Reply with one word."},
            {"role": "user", "content": f"Question: {question}\nTeammate: {said}"},
        ],
        max_tokens=4,
        **sampling,
    )
    heard = bob.choices[0].message.content or ""
    return {"alice": reward("alice", said), "bob": reward("bob", heard)}


def report(
    gateway: str, api_key: str, episode: str, rewards: dict[str, float], group: str, group_size: int
) -> None:
    """POST the episode's rewards to the gateway (ends the episode; it becomes training data)."""
    body = json.dumps({"rewards": rewards, "group_id": group, "group_size": group_size}).encode()
    req = urllib.request.Request(
        f"{gateway.rstrip('/')}/episodes/{episode}/reward",
        data=body,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        resp.read()


def wait_for_version(gateway: str, api_key: str, version: int, timeout_s: float = 1800.0) -> None:
    """Wait until every model the gateway lists has reached ``version`` (the job finished that many updates)."""
    client = openai.OpenAI(base_url=gateway, api_key=api_key, max_retries=5)
    deadline = time.monotonic() + timeout_s
    while True:
        versions = [
            m.model_extra.get("policy_version", 0) for m in client.models.list().data if "@" not in m.id
        ]
        if versions and min(versions) >= version:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"policy versions {versions} did not reach {version} within {timeout_s:.0f}s")
        time.sleep(1.0)


def main(argv: list[str] | None = None) -> int:
    """Play training episodes (grouped by question) or evaluate on held-out questions; print mean rewards."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gateway", required=True, help="the gateway's OpenAI base URL, http://HOST:PORT/v1")
    p.add_argument("--api-key", default=os.environ.get("MARTI_TOKEN") or "none")
    p.add_argument("--rounds", type=int, default=5, help="rounds of training episodes (one per update)")
    p.add_argument(
        "--episodes-per-round", type=int, default=32, help="episodes per round (a multiple of --group-size)"
    )
    p.add_argument("--group-size", type=int, default=8, help="episodes per question (a GRPO group)")
    p.add_argument("--seed", type=int, default=0, help="which questions come first")
    p.add_argument("--evaluate", action="store_true", help="greedy, held-out questions, nothing recorded")
    p.add_argument(
        "--wait-version", type=int, default=0, help="first wait until every policy has this version"
    )
    p.add_argument(
        "--concurrency", type=int, default=8, help="episodes played at once (the gateway batches them)"
    )
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args(argv)
    if args.wait_version:
        wait_for_version(args.gateway, args.api_key, args.wait_version)
    totals = dict.fromkeys(TARGETS, 0.0)
    pool = ThreadPoolExecutor(max(1, args.concurrency))
    if args.evaluate:
        jobs = [
            pool.submit(play, args.gateway, args.api_key, q, episode=None, group="", greedy=True)
            for q in HELD_OUT_QUESTIONS
        ]
        for job in jobs:
            for a, r in job.result().items():
                totals[a] += r / len(HELD_OUT_QUESTIONS)
    else:

        def episode(question: str, group: str) -> dict[str, float]:
            eid = uuid.uuid4().hex
            got = play(args.gateway, args.api_key, question, episode=eid, group=group, greedy=False)
            report(args.gateway, args.api_key, eid, got, group, args.group_size)
            return got

        n = 0
        for rnd in range(args.rounds):
            # on-policy rounds: round ``rnd`` is played by version ``rnd``; update ``rnd + 1`` trains on it alone
            wait_for_version(args.gateway, args.api_key, rnd)
            jobs = []
            for _ in range(args.episodes_per_round):
                q_index = (args.seed + n // args.group_size) % len(TRAIN_QUESTIONS)
                group = f"q{q_index}-{args.seed}-{n // args.group_size}"
                jobs.append(pool.submit(episode, TRAIN_QUESTIONS[q_index], group))
                n += 1
            for job in jobs:
                got = job.result()
                for a, r in got.items():
                    totals[a] += r / (args.rounds * args.episodes_per_round)
                if args.verbose:
                    print(f"round {rnd}: {got}", flush=True)
    pool.shutdown()
    print(" ".join(f"{a}={r:.3f}" for a, r in totals.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
