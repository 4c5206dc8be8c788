"""The Python side of the Node.js interop example: the leader of a resource_allocation team.

It waits for the Node.js executor (``agent.js``) to invite it through comm_broker, then steps its own turns in
the env session the Node agent created, sends each plan and the executor's next observation back through the
broker (one zstd batch per turn), reads the Node agent's trajectory back from experience_store, shares its own,
and prints one JSON summary line. Every payload the two sides exchange is checked by SHA-256 on the other side.

Run it next to the Node agent (same addresses, same ``--session``)::

    python examples/node_agent/partner.py --env HOST:PORT --broker HOST:PORT --store HOST:PORT --session S
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from typing import Any

from marti.clients.broker import MartiCommClient, Message, encode_payload
from marti.clients.env import EnvClient
from marti.clients.experience import ExperienceSharingClient
from marti.errors import DeadlineExceededError
from marti.types.trajectory import Trajectory, Turn


def leader_plan(problem: dict[str, Any]) -> dict[str, int]:
    """Plan by value density: minimums first, then units to the task with the best value per resource unit.

    Args:
        problem: ``Problem.to_dict()`` of the JSON observation (resources, tasks, exclusive_pairs).

    Returns:
        Task name -> units; keeps every capacity, max/min unit and exclusive-pair constraint.
    """
    caps = {r["name"]: r["capacity"] for r in problem["resources"]}
    alloc = {t["name"]: t["min_units"] for t in problem["tasks"]}

    def fits(trial: dict[str, int]) -> bool:
        for r, c in caps.items():
            if sum(t["demand_per_unit"].get(r, 0) * trial[t["name"]] for t in problem["tasks"]) > c:
                return False
        if any(trial[t["name"]] > t["max_units"] for t in problem["tasks"]):
            return False
        return not any(trial[a] > 0 and trial[b] > 0 for a, b in problem["exclusive_pairs"])

    order = sorted(
        problem["tasks"],
        key=lambda t: -t["value_per_unit"] / max(1, sum(t["demand_per_unit"].values())),
    )
    while True:
        nxt = next((t for t in order if fits({**alloc, t["name"]: alloc[t["name"]] + 1})), None)
        if nxt is None:
            return alloc
        alloc[nxt["name"]] += 1


class Partner:
    """State of the Python leader during one episode.

    Args:
        args: Parsed command-line arguments (addresses, token, session, timeout).
    """

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.deadline = time.monotonic() + args.timeout_s
        self.comm = MartiCommClient(
            args.agent,
            args.broker,
            session=args.session,
            token=args.token,
            batching_size=64,
            update_frequency_s=0.0,
        )
        self.env = EnvClient(args.env, token=args.token)
        self.store = ExperienceSharingClient(args.agent, args.store, token=args.token)
        self.inbox: list[Message] = []
        self.sent_sha256: list[str] = []
        self.received_sha256: list[str] = []

    def expect(self, kind: str) -> dict[str, Any]:
        """Return the next message of type ``kind`` from the Node agent (long polls until the deadline).

        Raises:
            DeadlineExceededError: Nothing of that type came before ``--timeout-s``.
        """
        while True:
            for i, msg in enumerate(self.inbox):
                if msg.content.get("type") == kind:
                    return self.inbox.pop(i).content
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise DeadlineExceededError(
                    f"no {kind!r} message from the Node agent in {self.args.timeout_s} s"
                )
            for msg in self.comm.get_messages(timeout_s=min(1.0, left)):
                self.received_sha256.append(hashlib.sha256(msg.payload).hexdigest())
                self.inbox.append(msg)

    def send(self, messages: list[dict[str, Any]]) -> None:
        """Send ``messages`` to the Node agent as one batch (one compressed frame)."""
        for msg in messages:
            self.sent_sha256.append(hashlib.sha256(encode_payload(msg)[0]).hexdigest())
            self.comm.send_message(self.args.peer, msg)
        self.comm.flush()

    def play(self) -> dict[str, Any]:
        """Play the episode as the leader; returns the JSON summary."""
        join = self.expect("join")
        obs_msg = self.expect("observation")
        session_id, episode_id = join["env_session_id"], join["episode_id"]
        observation, turns, verified, final_infos = obs_msg["observation"], [], 0, None
        while True:
            doc = json.loads(observation)
            plan = leader_plan(doc["problem"])
            text = "\n".join(f"{name}: {units}" for name, units in plan.items())
            result = self.env.step(session_id, {self.args.agent: text})
            done = not result.agents
            turns.append(
                Turn(step=doc["turn"], reward=result.rewards[self.args.agent], prompt_text=observation,
                     response_text=text, terminated=result.terminations[self.args.agent],
                     truncated=result.truncations[self.args.agent])
            )  # fmt: skip
            peer_obs = None if done else result.observations[self.args.peer]
            self.send(
                [
                    {"type": "plan", "plan": plan, "turn": doc["turn"]},
                    {
                        "type": "your_turn",
                        "done": done,
                        "observation": peer_obs,
                        "received_sha256": self.received_sha256,
                    },
                ]
            )
            if done:
                break
            reply = self.expect("result")
            verified += sum(d in self.sent_sha256 for d in reply["received_sha256"])
            if len(set(reply["received_sha256"]) - set(self.sent_sha256)):
                raise ValueError("the Node agent reports a payload digest this agent never sent")
            turns[-1].reward = (turns[-1].reward or 0.0) + reply["rewards"][self.args.agent]
            if reply["done"]:
                turns[-1].terminated = reply["terminations"][self.args.agent]
                turns[-1].truncated = reply["truncations"][self.args.agent]
                final_infos = reply["infos"]
                break
            observation = reply["observation"]
        shared = self.expect("shared")
        node_trajectories = self.store.get_trajectories(episode_id=episode_id, agent_id=self.args.peer)
        mine = Trajectory(episode_id=episode_id, agent_id=self.args.agent, session=session_id, role="leader",
                          turns=turns, metadata={"language": "python"})  # fmt: skip
        key = self.store.share_experience(mine)
        self.send([{"type": "partner_shared", "key": key, "num_turns": len(turns)}])
        stats = self.comm.get_communication_stats()
        return {
            "ok": True,
            "episode_id": episode_id,
            "env_session_id": session_id,
            "my_key": key,
            "node_key": shared["key"],
            "node_trajectories": [
                {
                    "agent_id": t.agent_id,
                    "role": t.role,
                    "turns": len(t.turns),
                    "metadata": t.metadata,
                    "actions": [x.response_text for x in t.turns],
                }
                for t in node_trajectories
            ],  # fmt: skip
            "final_infos": final_infos,
            "sent_sha256": self.sent_sha256,
            "received_sha256": self.received_sha256,
            "verified_by_node": verified,
            "compression_ratio": stats.compression_ratio,
            "bytes_received_raw": stats.bytes_received_raw,
            "bytes_received_wire": stats.bytes_received_wire,
            "bytes_sent_raw": stats.bytes_sent_raw,
            "bytes_sent_wire": stats.bytes_sent_wire,
        }

    def close(self) -> None:
        """Close the three clients."""
        self.comm.close()
        self.env.close()
        self.store.close()


def main(argv: list[str] | None = None) -> int:
    """Parse flags, play one episode with the Node agent, print the summary; returns the exit code."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag in ("--env", "--broker", "--store", "--session"):
        p.add_argument(flag, required=True)
    p.add_argument("--token", default=None)
    p.add_argument("--agent", default="agent_1")
    p.add_argument("--peer", default="agent_2")
    p.add_argument("--timeout-s", type=float, default=60.0)
    args = p.parse_args(argv)
    partner = Partner(args)
    try:
        print(json.dumps(partner.play()), flush=True)
    finally:
        partner.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
