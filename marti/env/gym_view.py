"""A Gymnasium single-agent view of any marti (PettingZoo parallel) environment.

For users who train one agent against fixed partners: one agent (the *learner*) is controlled through the
standard ``gymnasium.Env`` API, every other agent is played by a fixed partner policy, a plain callable.

Mapping (PettingZoo parallel -> Gymnasium):

* ``observation_space`` / ``action_space``: the learner's spaces.
* ``reset(seed, options) -> (obs, info)``: resets the multi-agent env, then lets the partners play until the
  learner must act (turn-based envs) or the episode ends; returns the learner's observation and info.
* ``step(action) -> (obs, reward, terminated, truncated, info)``: the learner's action plus each acting
  partner's ``policy(observation, info)`` form the joint action; after the step the partners keep playing
  alone while the learner is not acting. ``reward`` is the sum of the learner's rewards over those env steps;
  ``terminated`` / ``truncated`` are the learner's flags (the view ends when the learner is no longer live).
* Who acts: the env's ``acting_agents`` when it has one (marti text envs, hosted AEC games, TextArena), else
  every live agent on every step (simultaneous games). Agents that are not acting receive the env's
  ``missing_action`` (``""`` for text envs) when the env declares one, else they are left out of the joint
  action.
* ``info`` is the learner's info from the last env step with one key added: ``partner_steps``, the number of
  env steps the partners played alone before the learner's next turn.

Example::

    env = marti.make("pettingzoo", entry_point="pettingzoo.classic.tictactoe_v3:env", text=True)
    view = SingleAgentView(env, "player_1", {"player_2": lambda obs, info: str(info["legal_actions"][0])})
    obs, info = view.reset(seed=0)
    obs, reward, terminated, truncated, info = view.step("4")
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import gymnasium
from pettingzoo import ParallelEnv

from marti.errors import FailedPreconditionError, InvalidArgumentError, ResourceExhaustedError

#: A fixed partner policy: ``policy(observation, info) -> action``.
PartnerPolicy = Callable[[Any, dict], Any]

#: Default limit of env steps the partners may play in a row without the learner acting.
DEFAULT_MAX_PARTNER_STEPS = 10_000

__all__ = ["DEFAULT_MAX_PARTNER_STEPS", "PartnerPolicy", "SingleAgentView", "make"]


class SingleAgentView(gymnasium.Env):
    """One agent of a multi-agent env as a ``gymnasium.Env``; the others follow fixed policies.

    Args:
        env: A PettingZoo ``ParallelEnv`` (``marti.make(...)``, local or remote).
        agent: The learner, one of ``env.possible_agents``.
        partners: One policy per other agent (``{agent: policy}``), or one policy for all of them.
        max_partner_steps: Most env steps the partners may play in a row before the learner acts (guards
            against envs where the learner never gets a turn).

    Raises:
        InvalidArgumentError: ``agent`` is not an agent of ``env``, a partner is missing (named) or unknown
            (named), or ``max_partner_steps < 1``.
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        env: ParallelEnv,
        agent: str,
        partners: Mapping[str, PartnerPolicy] | PartnerPolicy,
        max_partner_steps: int = DEFAULT_MAX_PARTNER_STEPS,
    ) -> None:
        agents = list(env.possible_agents)
        if agent not in agents:
            raise InvalidArgumentError(f"learner {agent!r} is not an agent of the env (agents: {agents})")
        others = [a for a in agents if a != agent]
        if callable(partners):
            policies = dict.fromkeys(others, partners)
        else:
            policies = dict(partners)
            missing = [a for a in others if a not in policies]
            unknown = sorted(set(policies) - set(others))
            if missing:
                raise InvalidArgumentError(f"no partner policy for agents {missing}")
            if unknown:
                raise InvalidArgumentError(f"partner policies for unknown or learner agents {unknown}")
        if max_partner_steps < 1:
            raise InvalidArgumentError(f"max_partner_steps must be >= 1, got {max_partner_steps}")
        self.env = env
        self.agent = agent
        self.partners = policies
        self.max_partner_steps = max_partner_steps
        self.observation_space = env.observation_space(agent)
        self.action_space = env.action_space(agent)
        self._obs: dict[str, Any] = {}
        self._infos: dict[str, dict] = {}
        self._done = True

    def _acting(self) -> list[str]:
        acting = getattr(self.env, "acting_agents", None)
        return list(acting) if acting is not None else list(self.env.agents)

    def _joint(self, learner_action: Any, include_learner: bool) -> dict[str, Any]:
        acting = set(self._acting())
        filler = getattr(self.env, "missing_action", None)
        joint: dict[str, Any] = {}
        for a in self.env.agents:
            if a == self.agent and include_learner:
                joint[a] = learner_action
            elif a in acting and a != self.agent:
                joint[a] = self.partners[a](self._obs.get(a), self._infos.get(a, {}))
            elif filler is not None:
                joint[a] = filler
        return joint

    def _env_step(self, joint: dict[str, Any]) -> tuple[float, bool, bool]:
        obs, rewards, terms, truncs, infos = self.env.step(joint)
        self._obs.update(obs)
        self._infos.update(infos)
        return float(rewards.get(self.agent, 0.0)), bool(terms.get(self.agent)), bool(truncs.get(self.agent))

    def _partners_play(self, reward: float, term: bool, trunc: bool) -> tuple[float, bool, bool, int]:
        steps = 0
        while not (term or trunc) and self.agent in self.env.agents and self.agent not in self._acting():
            if steps >= self.max_partner_steps:
                raise ResourceExhaustedError(
                    f"partners played {steps} steps in a row without a turn for {self.agent!r} "
                    f"(limit max_partner_steps={self.max_partner_steps})"
                )
            r, term, trunc = self._env_step(self._joint(None, include_learner=False))
            reward += r
            steps += 1
        if not (term or trunc) and self.agent not in self.env.agents:
            term = True  # removed from the env without a flag: the episode is over for the learner
        return reward, term, trunc, steps

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        """Reset the env and let the partners play until the learner's first turn.

        Args:
            seed: Passed to the env's ``reset``.
            options: Passed to the env's ``reset``.

        Returns:
            ``(observation, info)`` of the learner (``info`` has ``partner_steps``).

        Raises:
            FailedPreconditionError: The episode ended before the learner's first turn.
            ResourceExhaustedError: The partners exceeded ``max_partner_steps``.
        """
        super().reset(seed=seed)
        self._obs, infos = self.env.reset(seed=seed, options=options)
        self._infos = {a: dict(i) for a, i in infos.items()}
        _, term, trunc, steps = self._partners_play(0.0, False, False)
        if term or trunc:
            raise FailedPreconditionError(f"the episode ended before {self.agent!r} had a turn")
        self._done = False
        return self._obs[self.agent], {**self._infos.get(self.agent, {}), "partner_steps": steps}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        """Play the learner's action (with the acting partners'), then the partners alone until its next turn.

        Args:
            action: The learner's action (an element of ``action_space``).

        Returns:
            ``(observation, reward, terminated, truncated, info)`` of the learner; ``reward`` sums the learner's
            rewards over every env step played.

        Raises:
            FailedPreconditionError: ``step`` after the episode ended (call ``reset``).
            ResourceExhaustedError: The partners exceeded ``max_partner_steps``.
        """
        if self._done:
            raise FailedPreconditionError("step called on a finished episode; call reset first")
        reward, term, trunc = self._env_step(self._joint(action, include_learner=True))
        reward, term, trunc, steps = self._partners_play(reward, term, trunc)
        self._done = term or trunc
        info = {**self._infos.get(self.agent, {}), "partner_steps": steps}
        return self._obs.get(self.agent), reward, term, trunc, info

    def close(self) -> None:
        """Close the wrapped env."""
        self.env.close()


def make(
    env_id: str,
    agent: str,
    partners: Mapping[str, PartnerPolicy] | PartnerPolicy,
    *,
    max_partner_steps: int = DEFAULT_MAX_PARTNER_STEPS,
    **make_kwargs: Any,
) -> SingleAgentView:
    """``marti.make(env_id, **make_kwargs)`` viewed as a single-agent Gymnasium env for ``agent``.

    Args:
        env_id: Registered env id (see ``marti.list_envs``).
        agent: The learner.
        partners: Partner policies (see :class:`SingleAgentView`).
        max_partner_steps: See :class:`SingleAgentView`.
        **make_kwargs: Passed to :func:`marti.make` (``address``, ``seed``, env config...).

    Returns:
        The view.
    """
    from marti.env.make import make as make_env

    return SingleAgentView(make_env(env_id, **make_kwargs), agent, partners, max_partner_steps)
