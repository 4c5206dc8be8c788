"""Adapters: host PettingZoo (parallel or AEC) and Gymnasium environments, and a text wrapper for LLM agents.

Environments are loaded by import path ``module:factory`` (``pettingzoo.classic.tictactoe_v3:env``); the
module must start with one of the allowed prefixes (``pettingzoo.`` and ``gymnasium.`` by default; the server
setting ``MARTI_ENV_ALLOWED_MODULES`` widens it), because the path arrives over the network.

* AEC envs become parallel envs turn by turn: each parallel step reads only the action of
  ``agent_selection`` (``acting_agents``), steps the AEC env once, sums every agent's reward and removes agents
  that are done. This also works for turn-based games, unlike PettingZoo's own ``aec_to_parallel``. An agent
  the game removes from ``agents`` without setting its termination or truncation flag ends truncated, with
  ``infos[agent]["truncated_reason"]`` saying so (parallel envs likewise).
* A Gymnasium env becomes a one-agent parallel env with agent ``agent_0``.
* ``text=True`` wraps envs whose action spaces are ``Discrete``: observations become natural-language text
  listing the legal actions (also in infos), actions are text read by :func:`parse_discrete_action`; an
  illegal or unreadable action costs ``illegal_action_penalty``, is reported in the next observation and
  infos, and the env does not advance (the agent tries again), so a bad action never crashes the env.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Sequence
from typing import Any

import gymnasium
import numpy as np
from pettingzoo import AECEnv, ParallelEnv

from marti.env.config import ConfigField, ConfigSchema
from marti.env.guard import mark_vanished
from marti.env.registry import EnvSpec, Registry
from marti.errors import InvalidArgumentError
from marti.plumbing.loader import load_attr
from services.env_server.envs.text_base import sanitize, text_space

#: Module prefixes an entry point may come from unless the server allows more.
DEFAULT_ALLOWED_MODULES: tuple[str, ...] = ("pettingzoo.", "gymnasium.")
_allowed_modules: list[str] = list(DEFAULT_ALLOWED_MODULES)

#: Human names of discrete actions for some PettingZoo classic games (metadata name -> names).
ACTION_NAMES = {"rps_v2": ["rock", "paper", "scissors", "lizard", "spock"]}


def set_allowed_modules(prefixes: Sequence[str]) -> None:
    """Replace the module prefixes entry points may come from (the server calls this from its settings)."""
    _allowed_modules[:] = list(prefixes)


def load_entry_point(path: str) -> Any:
    """Import ``module:attr`` and return the attribute.

    Raises:
        InvalidArgumentError: ``path`` is not ``module:attr`` or its module is not allowed (the message names
            the allowed prefixes).
        NotFoundError: The module or attribute does not exist.
    """
    return load_attr(path, allowed=_allowed_modules, what="entry_point", form="'module:factory'")


def build_from_entry_point(env_id: str, config: dict[str, Any]) -> Any:
    """Load ``config["entry_point"]`` and call it with ``config["kwargs"]``.

    The kwargs are first bound to the factory's signature (``inspect.signature(...).bind``), so a missing
    required key or one it does not take is refused before it runs. A ``TypeError`` the call raises is the
    user's too when its message names a kwargs key (a factory passing ``**kwargs`` on, or checking a value's
    type: ``Expect the `max_episode_steps` to be an integer``); any other ``TypeError`` comes from the env's own
    code and is raised unchanged.

    Args:
        env_id: The adapter's env id (``pettingzoo``, ``gymnasium``), for the message.
        config: The env config (``entry_point``, ``kwargs``).

    Returns:
        What the factory returned.

    Raises:
        InvalidArgumentError: The entry point is not callable, ``kwargs`` misses a key the factory needs or has
            one it does not take (``does not accept the kwargs key 'bad'``), or the call raised a ``TypeError``
            naming a kwargs key; the message names the env, the entry point and the ``TypeError``'s text, the
            same in process and from the env server (INVALID_ARGUMENT there, not INTERNAL).
        NotFoundError / InvalidArgumentError: What :func:`load_entry_point` raises.
    """
    entry_point = config["entry_point"]
    factory = load_entry_point(entry_point)
    kwargs = config["kwargs"] or {}
    where = f"env {env_id!r}: entry_point {entry_point!r}"
    if not callable(factory):
        raise InvalidArgumentError(f"{where} is not callable (of type {type(factory).__name__})")
    _bind_kwargs(where, factory, kwargs)
    try:
        return factory(**kwargs)
    except TypeError as exc:
        if _kwarg_named(str(exc), kwargs) is None:
            raise
        raise _kwargs_error(where, exc, kwargs) from exc


def _bind_kwargs(where: str, factory: Any, kwargs: dict[str, Any]) -> None:
    """Refuse ``kwargs`` that do not fit ``factory``'s signature (nothing checked when it has none to read)."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin or C callable without a readable signature
        return
    try:
        signature.bind(**kwargs)
    except TypeError as exc:
        raise _kwargs_error(where, exc, kwargs) from None


def _kwarg_named(message: str, kwargs: dict[str, Any]) -> str | None:
    """The first key of ``kwargs`` that ``message`` names as a whole word (or in backquotes), else None."""
    for key in kwargs:
        if re.search(rf"(?<![A-Za-z0-9_]){re.escape(str(key))}(?![A-Za-z0-9_])", message):
            return key
    return None


def _kwargs_error(where: str, exc: TypeError, kwargs: dict[str, Any]) -> InvalidArgumentError:
    """The error for adapter ``kwargs`` the factory refused (``exc``), naming the key when it is one given."""
    unexpected = re.search(r"unexpected keyword argument '([^']+)'", str(exc))
    if unexpected is not None and unexpected.group(1) in kwargs:
        what = f"does not accept the kwargs key {unexpected.group(1)!r}"
    else:
        what = "refused its kwargs"
    return InvalidArgumentError(f"{where} {what} (TypeError: {exc}); kwargs given: {sorted(kwargs)}")


class _FirstSeed:
    """Uses the ``make`` seed for the first ``reset`` that passes no seed (reproducible first episode)."""

    _first_seed: int | None = None

    def _seed_for(self, seed: int | None) -> int | None:
        if seed is None and self._first_seed is not None:
            seed, self._first_seed = self._first_seed, None
        elif seed is not None:
            self._first_seed = None
        return seed


class AECToParallel(_FirstSeed, ParallelEnv):
    """Turn-by-turn parallel view of an AEC env (see module docstring).

    Args:
        aec: The AEC env (a fresh instance).
        max_turns: Truncate every agent after this many parallel steps (``None``: no limit).
    """

    def __init__(self, aec: AECEnv, max_turns: int | None = None) -> None:
        self.aec = aec
        self.max_turns = max_turns
        self.possible_agents = list(aec.possible_agents)
        self.metadata = dict(getattr(aec, "metadata", {}) or {})
        self.agents: list[str] = []
        self._turn = 0

    def observation_space(self, agent: str) -> gymnasium.Space:
        """The AEC env's observation space."""
        return self.aec.observation_space(agent)

    def action_space(self, agent: str) -> gymnasium.Space:
        """The AEC env's action space."""
        return self.aec.action_space(agent)

    @property
    def acting_agents(self) -> list[str]:
        """``[agent_selection]`` while the episode runs, else ``[]``."""
        return [self.aec.agent_selection] if self.agents else []

    def _skip_dead(self) -> None:
        a = self.aec
        while a.agents and (a.terminations[a.agent_selection] or a.truncations[a.agent_selection]):
            a.step(None)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        """Reset the AEC env; returns observations and infos of every agent."""
        self.aec.reset(seed=self._seed_for(seed), options=options)
        self._turn = 0
        self.agents = list(self.aec.agents)
        return {a: self.aec.observe(a) for a in self.agents}, {
            a: dict(self.aec.infos[a]) for a in self.agents
        }

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        """Step ``agent_selection`` with its action; returns PettingZoo parallel tuples for the live agents."""
        live = list(self.agents)
        a = self.aec
        a.step(actions[a.agent_selection])
        self._turn += 1
        rewards = {x: float(a.rewards.get(x, 0.0)) for x in live}
        cut = self.max_turns is not None and self._turn >= self.max_turns
        terms = {x: bool(a.terminations.get(x, True)) for x in live}
        truncs = {x: bool(a.truncations.get(x, True)) or (cut and not terms[x]) for x in live}
        obs = {x: a.observe(x) for x in live}
        infos = {x: dict(a.infos.get(x, {})) for x in live}
        self._skip_dead()
        result = (obs, rewards, terms, truncs, infos)
        mark_vanished(live, a.agents, result)  # a game that empties agents without flags ends them truncated
        self.agents = [x for x in a.agents if not (terms.get(x) or truncs.get(x))]
        return result

    def render(self) -> Any:
        """Render the AEC env."""
        return self.aec.render()

    def close(self) -> None:
        """Close the AEC env."""
        self.aec.close()


class ParallelPassthrough(_FirstSeed, ParallelEnv):
    """A native PettingZoo parallel env with an optional ``max_turns`` truncation.

    Args:
        env: The parallel env.
        max_turns: Truncate after this many steps (``None``: no limit).
    """

    def __init__(self, env: ParallelEnv, max_turns: int | None = None) -> None:
        self.env = env
        self.max_turns = max_turns
        self.possible_agents = list(env.possible_agents)
        self.metadata = dict(getattr(env, "metadata", {}) or {})
        self._turn = 0

    @property
    def agents(self) -> list[str]:
        """Live agents."""
        return self.env.agents

    def observation_space(self, agent: str) -> gymnasium.Space:
        """The env's observation space."""
        return self.env.observation_space(agent)

    def action_space(self, agent: str) -> gymnasium.Space:
        """The env's action space."""
        return self.env.action_space(agent)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        """Reset the env."""
        self._turn = 0
        return self.env.reset(seed=self._seed_for(seed), options=options)

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        """Step the env, truncating at ``max_turns``; an agent the env removed without a flag is truncated
        (:func:`marti.env.guard.mark_vanished`)."""
        live = list(self.env.agents)
        obs, rew, term, trunc, info = self.env.step(actions)
        mark_vanished(live, self.env.agents, (obs, rew, term, trunc, info))
        self._turn += 1
        if self.max_turns is not None and self._turn >= self.max_turns:
            trunc = {a: True for a in trunc}
            self.env.agents = []
        return obs, rew, term, trunc, info

    def render(self) -> Any:
        """Render the env."""
        return self.env.render()

    def close(self) -> None:
        """Close the env."""
        self.env.close()


class GymnasiumToParallel(_FirstSeed, ParallelEnv):
    """A Gymnasium env as a one-agent parallel env (agent ``agent_0``).

    Args:
        env: The Gymnasium env.
    """

    AGENT = "agent_0"

    def __init__(self, env: gymnasium.Env) -> None:
        self.env = env
        self.possible_agents = [self.AGENT]
        self.agents: list[str] = []
        self.metadata = {"name": getattr(getattr(env, "spec", None), "id", None) or type(env).__name__}

    def observation_space(self, agent: str) -> gymnasium.Space:
        """The env's observation space."""
        return self.env.observation_space

    def action_space(self, agent: str) -> gymnasium.Space:
        """The env's action space."""
        return self.env.action_space

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        """Reset the env."""
        obs, info = self.env.reset(seed=self._seed_for(seed), options=options)
        self.agents = [self.AGENT]
        return {self.AGENT: obs}, {self.AGENT: dict(info)}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        """Step with ``actions["agent_0"]``."""
        obs, reward, term, trunc, info = self.env.step(actions[self.AGENT])
        a = self.AGENT
        if term or trunc:
            self.agents = []
        return {a: obs}, {a: float(reward)}, {a: bool(term)}, {a: bool(trunc)}, {a: dict(info)}

    def render(self) -> Any:
        """Render the env."""
        return self.env.render()

    def close(self) -> None:
        """Close the env."""
        self.env.close()


_INT_RE = re.compile(r"-?\d+")


def parse_discrete_action(text: str, n: int, names: Sequence[str] = ()) -> int | None:
    """Read a discrete action from text: the first integer, else the first action name mentioned.

    Args:
        text: The agent's message.
        n: Number of actions.
        names: Optional human names of actions ``0..n-1``.

    Returns:
        The action index, or ``None`` when nothing readable is found or the index is out of ``[0, n)``.
    """
    m = _INT_RE.search(text)
    if m:
        v = int(m.group(0))
        return v if 0 <= v < n else None
    low = text.lower()
    hits = [(low.find(name), i) for i, name in enumerate(names[:n]) if name in low]
    return min(hits)[1] if hits else None


def _render_planes(planes: np.ndarray, n_actions: int) -> list[str]:
    h, w, _ = planes.shape
    lines = [
        "Board (X = yours, O = opponent's" + (", numbers = free cells):" if n_actions == h * w else "):")
    ]
    if n_actions == w:
        lines.append(" ".join(str(c) for c in range(w)) + "   <- column numbers")
    for i in range(h):
        row = []
        for j in range(w):
            if planes[i, j, 0]:
                row.append("X")
            elif planes[i, j, 1]:
                row.append("O")
            else:
                row.append(str(i * w + j) if n_actions == h * w else ".")
        lines.append(" ".join(row))
    return lines


class DiscreteTextWrapper(ParallelEnv):
    """Text observations and actions over a parallel env with ``Discrete`` action spaces (module docstring).

    Args:
        env: The parallel env.
        illegal_action_penalty: Reward added to an agent whose action is illegal or unreadable.
        max_observation_chars: Length limit of observation text.
        max_action_chars: Length limit of action text.
        max_turns: Truncate after this many steps, illegal attempts included (``None``: no limit).

    Raises:
        InvalidArgumentError: An agent's action space is not ``Discrete``.
    """

    missing_action = ""

    def __init__(
        self,
        env: ParallelEnv,
        illegal_action_penalty: float = 0.1,
        max_observation_chars: int = 8192,
        max_action_chars: int = 4096,
        max_turns: int | None = 200,
    ) -> None:
        self.env = env
        self.possible_agents = list(env.possible_agents)
        self.metadata = dict(getattr(env, "metadata", {}) or {})
        for a in self.possible_agents:
            if not isinstance(env.action_space(a), gymnasium.spaces.Discrete):
                raise InvalidArgumentError(
                    f"text=True needs Discrete action spaces; {a!r} has {env.action_space(a)}"
                )
        self.penalty = illegal_action_penalty
        self.max_turns = max_turns
        self._obs_space = text_space(max_observation_chars, min_length=1)
        self._act_space = text_space(max_action_chars, min_length=0)
        self._max_obs = max_observation_chars
        self.agents: list[str] = []
        self._raw_obs: dict = {}
        self._raw_infos: dict = {}
        self._feedback: dict[str, str] = {}
        self._turn = 0

    def observation_space(self, agent: str) -> gymnasium.spaces.Text:
        """Text observation space."""
        return self._obs_space

    def action_space(self, agent: str) -> gymnasium.spaces.Text:
        """Text action space (empty allowed)."""
        return self._act_space

    @property
    def acting_agents(self) -> list[str]:
        """Agents whose action is read this step."""
        inner = getattr(self.env, "acting_agents", None)
        return list(inner) if inner is not None else list(self.agents)

    def _legal(self, agent: str) -> list[int]:
        n = int(self.env.action_space(agent).n)
        obs, info = self._raw_obs.get(agent), self._raw_infos.get(agent, {})
        mask = obs.get("action_mask") if isinstance(obs, dict) else info.get("action_mask")
        if mask is None:
            return list(range(n)) if agent in self.acting_agents else []
        return [i for i in range(n) if mask[i]]

    def _names(self, agent: str) -> list[str]:
        return ACTION_NAMES.get(self.metadata.get("name", ""), [])[: int(self.env.action_space(agent).n)]

    def _text(self, agent: str) -> str:
        name = self.metadata.get("name", "a game")
        obs = self._raw_obs.get(agent)
        board = obs.get("observation") if isinstance(obs, dict) else obs
        n = int(self.env.action_space(agent).n)
        lines = [
            f"You are {agent} playing {name} against {', '.join(a for a in self.possible_agents if a != agent)}."
        ]
        if isinstance(board, np.ndarray) and board.ndim == 3 and board.shape[2] == 2:
            lines += _render_planes(board, n)
        else:
            lines.append(
                "Observation: " + json.dumps(np.asarray(board).tolist() if board is not None else None)
            )
        names = self._names(agent)
        legal = self._legal(agent)
        if agent in self.acting_agents and self.agents:
            shown = ", ".join(f"{i} ({names[i]})" if i < len(names) else str(i) for i in legal)
            lines.append(f"Legal actions: {shown}. Reply with the number of your action.")
        elif self.agents:
            lines.append("Not your turn; reply with an empty message.")
        else:
            lines.append("The game is over.")
        if self._feedback.get(agent):
            lines.append(self._feedback[agent])
        return sanitize("\n".join(lines), self._max_obs) or "(no observation)"

    def _infos(self, agents: list[str]) -> dict[str, dict]:
        out = {}
        for a in agents:
            info = {
                k: (np.asarray(v).tolist() if isinstance(v, np.ndarray) else v)
                for k, v in self._raw_infos.get(a, {}).items()
            }
            legal = self._legal(a)
            names = self._names(a)
            info.update(
                is_acting=a in self.acting_agents and bool(self.agents),
                legal_actions=legal,
                legal_action_names=[names[i] if i < len(names) else str(i) for i in legal],
                illegal_action=self._feedback.get(a, ""),
            )
            out[a] = info
        return out

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        """Reset the inner env; returns text observations and infos with legal actions."""
        self._raw_obs, self._raw_infos = self.env.reset(seed=seed, options=options)
        self.agents = list(self.env.agents)
        self._feedback, self._turn = {}, 0
        return {a: self._text(a) for a in self.agents}, self._infos(self.agents)

    def step(self, actions: dict[str, str]) -> tuple[dict, dict, dict, dict, dict]:
        """Read each acting agent's text; step the inner env only when every acting agent's action is legal."""
        live = list(self.agents)
        self._feedback = {}
        rewards = dict.fromkeys(live, 0.0)
        parsed = {}
        for a in self.acting_agents:
            text = actions.get(a, "")
            act = parse_discrete_action(text, int(self.env.action_space(a).n), self._names(a))
            if act is None or act not in self._legal(a):
                self._feedback[a] = (
                    f"Your action {sanitize(text, 40)!r} is not legal; choose one of the legal actions."
                )
                rewards[a] -= self.penalty
            parsed[a] = act
        self._turn += 1
        terms = dict.fromkeys(live, False)
        truncs = dict.fromkeys(live, False)
        if not self._feedback:
            obs, rew, term, trunc, infos = self.env.step(parsed)
            self._raw_obs.update(obs)
            self._raw_infos.update(infos)
            for a in live:
                rewards[a] += float(rew.get(a, 0.0))
                terms[a] = bool(term.get(a, False))
                truncs[a] = bool(trunc.get(a, False))
        if self.max_turns is not None and self._turn >= self.max_turns:
            truncs = {a: truncs[a] or not terms[a] for a in live}
        self.agents = [a for a in live if not (terms[a] or truncs[a])]
        return {a: self._text(a) for a in live}, rewards, terms, truncs, self._infos(live)

    def close(self) -> None:
        """Close the inner env."""
        self.env.close()


ADAPTER_FIELDS = (
    ConfigField("entry_point", "str", "", "import path 'module:factory' of the env to host"),
    ConfigField("kwargs", "dict", None, "keyword arguments for the factory (JSON-like values)"),
    ConfigField("text", "bool", False, "wrap Discrete action spaces as text for LLM agents"),
    ConfigField(
        "max_turns",
        "int",
        None,
        "truncate after this many steps (default: the env's own limit)",
        minimum=1,
        maximum=1_000_000,
    ),
    ConfigField(
        "illegal_action_penalty", "float", 0.1, "text mode: reward added for an illegal action", minimum=0.0
    ),
    ConfigField("max_observation_chars", "int", 8192, "text mode: observation length limit", minimum=256),
    ConfigField("max_action_chars", "int", 4096, "action text length limit", minimum=16),
)


def make_pettingzoo(config: dict[str, Any], seed: int | None) -> ParallelEnv:
    """Build a hosted PettingZoo env from ``config["entry_point"]`` (a parallel or AEC env factory).

    Raises:
        InvalidArgumentError: No entry point, not allowed, a ``kwargs`` key the factory does not take (named), or
            the factory returns something else.
        NotFoundError: The entry point does not exist.
    """
    env = build_from_entry_point("pettingzoo", config)
    if isinstance(env, AECEnv):
        base: AECToParallel | ParallelPassthrough = AECToParallel(
            env, None if config["text"] else config["max_turns"]
        )
    elif isinstance(env, ParallelEnv):
        base = ParallelPassthrough(env, None if config["text"] else config["max_turns"])
    else:
        raise InvalidArgumentError(
            f"entry_point {config['entry_point']!r} returned {type(env).__name__}, "
            "not a PettingZoo AECEnv or ParallelEnv"
        )
    base._first_seed = seed
    par: ParallelEnv = base
    if config["text"]:
        return DiscreteTextWrapper(
            par,
            config["illegal_action_penalty"],
            config["max_observation_chars"],
            config["max_action_chars"],
            config["max_turns"] or 200,
        )
    return par


def make_gymnasium(config: dict[str, Any], seed: int | None) -> ParallelEnv:
    """Build a hosted Gymnasium env from ``config["entry_point"]`` as a one-agent parallel env.

    Raises:
        InvalidArgumentError: No entry point, not allowed, a ``kwargs`` key the factory does not take (named), or
            not a ``gymnasium.Env``.
        NotFoundError: The entry point does not exist.
    """
    env = build_from_entry_point("gymnasium", config)
    if not isinstance(env, gymnasium.Env):
        raise InvalidArgumentError(
            f"entry_point {config['entry_point']!r} returned {type(env).__name__}, not a gymnasium.Env"
        )
    if config["max_turns"] is not None:
        env = gymnasium.wrappers.TimeLimit(env, config["max_turns"])
    gym_par = GymnasiumToParallel(env)
    gym_par._first_seed = seed
    par: ParallelEnv = gym_par
    if config["text"]:
        par = DiscreteTextWrapper(
            par,
            config["illegal_action_penalty"],
            config["max_observation_chars"],
            config["max_action_chars"],
            config["max_turns"],
        )
    return par


def register(registry: Registry) -> None:
    """Register ``pettingzoo-v1`` and ``gymnasium-v1``."""
    schema = ConfigSchema(ADAPTER_FIELDS)
    registry.register(
        EnvSpec(
            "pettingzoo",
            1,
            make_pettingzoo,
            schema,
            "Any PettingZoo parallel or AEC env by entry_point 'module:factory'.",
            {"entry_point": "pettingzoo.classic.rps_v2:parallel_env"},
        )
    )
    registry.register(
        EnvSpec(
            "gymnasium",
            1,
            make_gymnasium,
            schema,
            "Any Gymnasium env by entry_point 'module:factory', as one agent 'agent_0'.",
            {"entry_point": "gymnasium.envs.classic_control.cartpole:CartPoleEnv"},
        )
    )
