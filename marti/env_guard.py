"""Input checks around any ``ParallelEnv``: bad input becomes a typed error and leaves the env untouched.

The same wrapper guards in-process envs made by ``marti.make`` and every server session, so a remote env and a
local one reject the same inputs with the same error classes.
"""

from __future__ import annotations

from typing import Any

import gymnasium
from pettingzoo import ParallelEnv

from marti.errors import FailedPreconditionError, InvalidArgumentError

#: Default length limit of a text action (characters) when the env config names none.
DEFAULT_MAX_ACTION_CHARS = 4096


class GuardedParallelEnv(ParallelEnv):
    """A ``ParallelEnv`` that checks every ``step`` before the wrapped env sees it.

    Checks, in order: the episode is running (``FailedPreconditionError`` before the first ``reset`` and after
    the last step); ``actions`` is a dict; no unknown agent (``InvalidArgumentError`` naming it); no agent that is
    done (named); no missing action for an acting agent unless the env declares ``missing_action`` (then it is
    filled in); text actions are ``str`` of at most ``max_action_chars`` characters (the error names the limit);
    other actions lie in the agent's action space. Actions of agents that are not acting this turn (per the
    env's ``acting_agents``) are accepted and passed through.

    Args:
        env: The environment (a fresh instance; the guard owns it).
        max_action_chars: Length limit of text actions, in characters.
    """

    def __init__(self, env: ParallelEnv, max_action_chars: int = DEFAULT_MAX_ACTION_CHARS) -> None:
        self.env = env
        self.max_action_chars = max_action_chars
        self.possible_agents = list(env.possible_agents)
        self.metadata = dict(getattr(env, "metadata", {}) or {})
        self._started = False

    @property
    def agents(self) -> list[str]:
        """Live agents of the wrapped env."""
        return self.env.agents

    @property
    def acting_agents(self) -> list[str]:
        """Agents whose actions count this turn (all live agents when the env does not say)."""
        return list(getattr(self.env, "acting_agents", self.env.agents))

    def observation_space(self, agent: str) -> gymnasium.Space:
        """Return the wrapped env's observation space for ``agent``."""
        return self.env.observation_space(agent)

    def action_space(self, agent: str) -> gymnasium.Space:
        """Return the wrapped env's action space for ``agent``."""
        return self.env.action_space(agent)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        """Reset the wrapped env; see ``ParallelEnv.reset``.

        Raises:
            InvalidArgumentError: ``seed`` is not an int or ``None``.
        """
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise InvalidArgumentError(f"seed must be an int or None, got {seed!r}")
        out = self.env.reset(seed=seed, options=options)
        self._started = True
        return out

    def check(self, actions: Any) -> dict[str, Any]:
        """Validate ``actions`` and return the dict the wrapped env will get.

        Raises:
            FailedPreconditionError: No episode is running.
            InvalidArgumentError: See the class docstring; the message names the agent, value or limit.
        """
        if not self._started:
            raise FailedPreconditionError("step before reset: call reset first")
        if not self.env.agents:
            raise FailedPreconditionError("the episode is over (no live agents): call reset")
        if not isinstance(actions, dict):
            raise InvalidArgumentError(
                f"actions must be a dict of agent -> action, got {type(actions).__name__}"
            )
        live = set(self.env.agents)
        for agent in actions:
            if agent not in self.possible_agents:
                raise InvalidArgumentError(
                    f"unknown agent {agent!r} (agents: {', '.join(self.possible_agents)})"
                )
            if agent not in live:
                raise InvalidArgumentError(f"agent {agent!r} is done this episode and cannot act")
        out = dict(actions)
        missing = [a for a in self.acting_agents if a not in out]
        if missing:
            if not hasattr(self.env, "missing_action"):
                raise InvalidArgumentError(f"missing action for agent(s) {', '.join(missing)}")
            for a in missing:
                out[a] = self.env.missing_action
        for agent, action in out.items():
            self._check_action(agent, action)
        return out

    def _check_action(self, agent: str, action: Any) -> None:
        space = self.env.action_space(agent)
        if isinstance(space, gymnasium.spaces.Text):
            if not isinstance(action, str):
                raise InvalidArgumentError(f"action of {agent!r} must be text, got {type(action).__name__}")
            if len(action) > self.max_action_chars:
                raise InvalidArgumentError(
                    f"action of {agent!r} has {len(action)} characters, above max_action_chars="
                    f"{self.max_action_chars}"
                )
            return
        try:
            ok = space.contains(action)
        except (TypeError, ValueError, AttributeError):
            ok = False
        if not ok and agent in self.acting_agents:
            raise InvalidArgumentError(f"action {action!r} of {agent!r} is not in its action space {space}")

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        """Check ``actions`` (see :meth:`check`) and step the wrapped env.

        Returns:
            PettingZoo ``(observations, rewards, terminations, truncations, infos)``.
        """
        return self.env.step(self.check(actions))

    def render(self) -> Any:
        """Render the wrapped env."""
        return self.env.render()

    def close(self) -> None:
        """Close the wrapped env."""
        self.env.close()
