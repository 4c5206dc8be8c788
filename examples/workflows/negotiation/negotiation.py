"""A user-defined two-agent negotiation, written only against marti's public API.

Everything a user needs to bring a new game to marti lives in this file; nothing in the framework is edited:

* :class:`NegotiationEnv`, a PettingZoo ``ParallelEnv`` registered by import path in the YAML
  (``environment.env_name: "examples/workflows/negotiation/negotiation.py:make_env"``);
* the parsers that turn each agent's reply into an action (``offer: <int>`` or ``accept``);
* the workflow (a user function deciding the next speaker) and a custom reward, built by :func:`build`
  (``workflow.factory`` in the YAML) with :mod:`marti.team.workflow`.

The game: a seller whose cost is ``c`` and a buyer whose value is ``v`` (``c < v``, drawn from the seed; each
sees only its own number) alternate offers, the seller first. ``accept`` closes the deal at the last offer ``P``.
The seller earns ``(P - c) / (v - c)``, the buyer ``(v - P) / (v - c)`` (so a deal inside ``[c, v]`` splits a
surplus of 1); no deal by ``max_turns`` gives both 0; an unreadable reply costs its author 0.1.
"""

from __future__ import annotations

import random
import re
from typing import Any

import gymnasium

from marti.env.make import ParallelEnv
from marti.team.workflow import EpisodeView, PromptContext, RewardAllocation, Role, Workflow, WorkflowState

AGENTS = ("seller", "buyer")
_OFFER_RE = re.compile(r"offer\s*[:=]?\s*\$?\s*(-?\d+)", re.I)
_INT_RE = re.compile(r"-?\d+")


class NegotiationEnv(ParallelEnv):
    """Alternating-offers bargaining between ``seller`` and ``buyer`` (see the module docstring).

    Args:
        max_turns: Most replies (both agents together) before the episode is truncated, >= 2.
        seed: Seed of the first reset without a seed.

    Raises:
        ValueError: ``max_turns < 2``.
    """

    # "metrics": the info keys the trainer reports as episode metrics (team/task_completion, ...).
    metadata = {"name": "negotiation_v0", "is_parallelizable": True, "metrics": ("task_completion",)}

    def __init__(self, max_turns: int = 6, seed: int | None = None) -> None:
        if max_turns < 2:
            raise ValueError(f"negotiation needs max_turns >= 2, got {max_turns}")
        self.max_turns = max_turns
        self.possible_agents = list(AGENTS)
        self.agents: list[str] = []
        self._seed = seed
        self._space = gymnasium.spaces.Text(2048)

    def observation_space(self, agent: str) -> gymnasium.spaces.Text:
        """Text observations."""
        return self._space

    def action_space(self, agent: str) -> gymnasium.spaces.Text:
        """Text actions: ``offer: <int>`` or ``accept``."""
        return self._space

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        """Draw cost and value; the seller acts first."""
        rng = random.Random(self._seed if seed is None else seed)
        self.cost = rng.randint(10, 50)
        self.value = self.cost + rng.randint(20, 60)
        self.agents = list(AGENTS)
        self.turn = 0
        self.offer: tuple[str, int] | None = None
        self.deal: int | None = None
        self.acting = "seller"
        self.errors = dict.fromkeys(AGENTS, 0)
        return self._obs(), self._infos()

    def _obs(self) -> dict[str, str]:
        last = (
            f"The last offer was {self.offer[1]} by the {self.offer[0]}." if self.offer else "No offer yet."
        )
        private = {"seller": f"Your cost is {self.cost}.", "buyer": f"Your value is {self.value}."}
        out = {}
        for a in AGENTS:
            turn = "It is your turn." if a == self.acting else "Wait for the other side."
            out[a] = (
                f"You are the {a} in a price negotiation. {private[a]} {last} {turn} "
                "Reply 'offer: <price>' or 'accept'."
            )
        return out

    def _infos(self) -> dict[str, dict[str, Any]]:
        return {
            a: {
                "is_acting": a == self.acting and self.deal is None,
                "role": a,
                "turn": self.turn,
                "deal": self.deal is not None,
                "price": -1 if self.deal is None else self.deal,
                "task_completion": float(self.deal is not None),
                "parse_error": False,
            }
            for a in AGENTS
        }

    def step(self, actions: dict[str, str]) -> tuple[dict, dict, dict, dict, dict]:
        """Read the acting agent's reply (the other's is ignored: the env keeps the rules)."""
        actor = self.acting
        text = str(actions.get(actor, "")).strip().lower()
        rewards = dict.fromkeys(AGENTS, 0.0)
        bad = False
        if text.startswith("accept") and self.offer is not None and self.offer[0] != actor:
            self.deal = self.offer[1]
        else:
            m = _OFFER_RE.search(text)
            if m:
                self.offer = (actor, int(m.group(1)))
            else:
                bad = True
                rewards[actor] -= 0.1
        self.turn += 1
        done = self.deal is not None
        truncated = not done and self.turn >= self.max_turns
        if done:
            span = self.value - self.cost
            rewards["seller"] += (self.deal - self.cost) / span
            rewards["buyer"] += (self.value - self.deal) / span
        self.acting = "buyer" if actor == "seller" else "seller"
        infos = self._infos()
        infos[actor]["parse_error"] = bad
        obs = self._obs()
        live = list(self.agents)
        if done or truncated:
            self.agents = []
        return obs, rewards, dict.fromkeys(live, done), dict.fromkeys(live, truncated), infos

    def close(self) -> None:
        """Nothing to release."""


def make_env(config: dict[str, Any], seed: int | None) -> NegotiationEnv:
    """Env factory named in the YAML: reads ``max_turns`` and ignores the trainer's other text-env keys."""
    return NegotiationEnv(int(config.get("max_turns", 6)), seed)


def parse_offer(text: str) -> str:
    """Reply -> action: ``accept``, ``offer: N`` (also from a bare number), or the text unchanged."""
    low = text.strip().lower()
    if "accept" in low and not _OFFER_RE.search(low):
        return "accept"
    m = _OFFER_RE.search(low) or _INT_RE.search(low)
    return f"offer: {int(m.group(1) if m.re is _OFFER_RE else m.group(0))}" if m else text


def alternate(state: WorkflowState) -> list[str]:
    """Next speaker: the seller opens, then whoever did not speak last."""
    if not state.transcript:
        return ["seller"]
    return ["buyer" if state.transcript[-1][1] == "seller" else "seller"]


def negotiation_prompt(ctx: PromptContext) -> str:
    """The observation plus the other side's last words."""
    said = "\n".join(f"{s} said: {t}" for s, t in ctx.messages[-2:])
    return f"{ctx.observation}\n{said}" if said else ctx.observation


def deal_bonus(episode: EpisodeView) -> dict[str, float]:
    """+0.2 to both sides when they reached a deal (agreement is worth something to each)."""
    deal = any(i.get("deal") for i in episode.final_infos.values())
    return dict.fromkeys(episode.agents, 0.2 if deal else 0.0)


def build(cfg: Any) -> Workflow:
    """The workflow named by ``workflow.factory``: roles, parsers, next speaker and rewards."""
    roles = [
        Role(
            a,
            system_prompt=f"You negotiate as the {a}. Be brief.",
            build_prompt=negotiation_prompt,
            parser=parse_offer,
        )
        for a in AGENTS
    ]
    return Workflow(
        alternate,
        roles=roles,
        reward_fn=deal_bonus,
        allocation=RewardAllocation(1.0, 1.0, 0.0),
        name="negotiation",
    )
