"""Input checks around any ``ParallelEnv``: bad input becomes a typed error and leaves the env untouched.

The same wrapper guards in-process envs made by ``marti.make`` and every server session, so a remote env and a
local one reject the same inputs with the same error classes. The argument checks (:func:`check_seed`,
:func:`check_actions`, :func:`check_options`, :func:`check_env_id`, :func:`closed_error`) are the one place
both the guard and the remote env client (``marti.clients.env``) check a caller's arguments, so a bad seed,
actions or options dict gives the same ``InvalidArgumentError`` locally and before any rpc.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium
from pettingzoo import ParallelEnv

from marti.errors import FailedPreconditionError, InternalError, InvalidArgumentError
from marti.plumbing.arguments import check_text

#: Default length limit of a text action (characters) when the env config names none.
DEFAULT_MAX_ACTION_CHARS = 4096
#: Seeds travel as protobuf ``int64``: the range every env accepts, in-process and remote alike.
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1
#: ``infos[agent]["truncated_reason"]`` of an agent the env removed without a termination or truncation flag.
VANISHED_REASON = "the env removed this agent without a termination or truncation flag"


def check_seed(seed: Any, name: str = "seed") -> int | None:
    """Return ``seed`` as an ``int`` (``None`` stays ``None``).

    Args:
        seed: ``None`` or an integer (Python or numpy) in ``[SEED_MIN, SEED_MAX]`` (int64).
        name: The argument's name, for the message.

    Raises:
        InvalidArgumentError: Not an integer (``bool`` included) or outside int64; the message names ``name``.
    """
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise InvalidArgumentError(f"{name} must be an int or None, got {type(seed).__name__} {seed!r}")
    value = int(seed)
    if not SEED_MIN <= value <= SEED_MAX:
        raise InvalidArgumentError(f"{name}={value} is outside the int64 range [-2**63, 2**63 - 1]")
    return value


def check_actions(actions: Any) -> Mapping[str, Any]:
    """Check that ``actions`` is a mapping of agent name (``str``) -> action.

    Raises:
        InvalidArgumentError: ``actions`` is not a mapping, a key is not a string (named), or a key or a text
            action is not valid Unicode that UTF-8 can carry (a lone surrogate; names ``actions[agent]``).
    """
    if not isinstance(actions, Mapping):
        raise InvalidArgumentError(f"actions must be a dict of agent -> action, got {type(actions).__name__}")
    for agent, action in actions.items():
        if not isinstance(agent, str):
            raise InvalidArgumentError(
                f"actions keys must be agent names (str), got {type(agent).__name__} {agent!r}"
            )
        check_text(agent, "actions key")
        check_text(action, f"actions[{agent!r}]")
    return actions


def check_options(options: Any) -> dict[str, Any] | None:
    """Check ``reset``'s ``options``: ``None`` or a dict with string keys and values the wire can carry
    (the :mod:`marti.codec.env` ``Value`` types), so an option refused remotely is refused in-process too.

    Raises:
        InvalidArgumentError: See :func:`check_wire_map` (named ``options``).
    """
    return check_wire_map(options, "options")


def check_wire_map(value: Any, name: str) -> dict[str, Any] | None:
    """Check a mapping argument that travels as a ``ValueMap`` (reset ``options``, an env ``config``): ``None``
    or a dict with string keys and values the wire can carry.

    Args:
        value: The caller's value.
        name: The argument's name, for the message (``"options"``, ``"config"``).

    Returns:
        ``None`` or a new dict of ``value``'s items.

    Raises:
        InvalidArgumentError: Not a mapping, a non-string key, text UTF-8 cannot carry (a lone surrogate), an
            integer outside int64, or a value that cannot be sent; the message names the key path
            (``options['a']['b']``).
    """
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidArgumentError(f"{name} must be a dict or None, got {type(value).__name__}")
    check_wire_value(value, name)
    return dict(value)


def check_wire_value(value: Any, name: str) -> None:
    """Check that the wire codec (:mod:`marti.codec.env` ``Value``) can carry ``value``.

    Args:
        value: Any Python value.
        name: Its name, the start of the key path in the message (``"options"``, ``"observations['a']"``).

    Raises:
        InvalidArgumentError: A part of ``value`` is text UTF-8 cannot carry (a lone surrogate), an integer
            outside int64, a map with a non-string key, or a type the codec cannot send (a set, an object); the
            message starts with that part's key path (``options['a']['b']``).
    """
    _check_wire_value(value, name)
    from marti.codec.env import value_to_proto

    try:
        value_to_proto(value)
    except InvalidArgumentError as e:
        raise InvalidArgumentError(f"{_unsendable_path(value, name)}: {e.message}") from None


def _unsendable_path(value: Any, path: str) -> str:
    """The key path (``options['a'][1]``) of the innermost part of ``value`` the wire codec refuses; ``path`` when
    no part of it is refused alone."""
    from marti.codec.env import value_to_proto

    if isinstance(value, Mapping):
        items: Any = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    else:
        return path
    for key, item in items:
        try:
            value_to_proto(item)
        except InvalidArgumentError:
            return _unsendable_path(item, f"{path}[{key!r}]")
    return path


def _check_wire_value(value: Any, path: str) -> None:
    """Refuse, naming ``path``, text UTF-8 cannot carry and integers outside int64 anywhere inside ``value``."""
    if isinstance(value, str):
        check_text(value, path)
    elif isinstance(value, numbers.Integral) and not isinstance(value, bool):
        if not SEED_MIN <= int(value) <= SEED_MAX:
            raise InvalidArgumentError(f"{path}={int(value)} is outside the int64 range [-2**63, 2**63 - 1]")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            check_text(key, f"{path} key")
            _check_wire_value(item, f"{path}[{key!r}]")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_wire_value(item, f"{path}[{i}]")


def check_env_id(env_id: Any) -> str:
    """Check that ``env_id`` is a non-empty string that UTF-8 can carry.

    Raises:
        InvalidArgumentError: It is not (the value is named).
    """
    if not isinstance(env_id, str) or not env_id:
        raise InvalidArgumentError(f"env_id must be a non-empty str, got {type(env_id).__name__} {env_id!r}")
    return check_text(env_id, "env_id")


def check_agent(agent: Any, possible_agents: list[str]) -> str:
    """Check that ``agent`` is one of ``possible_agents`` (for ``observation_space`` / ``action_space``).

    Raises:
        InvalidArgumentError: An unknown agent (named, with the env's agents).
    """
    if not isinstance(agent, str) or agent not in possible_agents:
        raise InvalidArgumentError(f"unknown agent {agent!r} (agents: {', '.join(possible_agents)})")
    return agent


def closed_error(env_id: str) -> FailedPreconditionError:
    """The error of a call on a closed env (in-process and remote envs raise the same)."""
    return FailedPreconditionError(f"the {env_id} env is closed; make a new one")


_STEP_PARTS = ("observations", "rewards", "terminations", "truncations", "infos")
_RESET_PARTS = ("observations", "infos")


def _check_parts(env_id: str, call: str, parts: tuple[str, ...], result: Any) -> tuple:
    """Check that ``result`` is one mapping per name of ``parts``, each keyed by the agents of the first.

    Raises:
        InternalError: Naming the env, the call and the part (and both agent lists).
    """
    if (
        not isinstance(result, tuple | list)
        or len(result) != len(parts)
        or not all(isinstance(p, Mapping) for p in result)
    ):
        raise InternalError(f"env {env_id}'s {call} returned {result!r:.120}, not ({', '.join(parts)}) dicts")
    obs = result[0]
    for name, part in zip(parts[1:], result[1:], strict=True):
        if part.keys() != obs.keys():
            raise InternalError(
                f"env {env_id}'s {call} returned {name} for agents {sorted(part)} but observations for "
                f"{sorted(obs)}: each of {', '.join(parts[1:])} must hold exactly the agents of observations"
            )
    return tuple(result)


def check_sendable_result(env_id: str, call: str, observations: Mapping, infos: Mapping) -> None:
    """Check that the env server can send a result: each agent's observation is a wire ``Value``
    (:func:`check_wire_value`), and the infos are JSON (as the server sends them when it can) or each a wire
    ``ValueMap``. The guard runs it in process and in every server session, so an env whose results a server
    cannot send fails the same way in process.

    Args:
        env_id: The env's id, named by the error.
        call: ``"reset"`` or ``"step"``.
        observations: ``{agent: observation}`` of the result.
        infos: ``{agent: info dict}`` of the result.

    Raises:
        InternalError: Naming the env, the call and the key path of the first part that cannot be sent
            (``observations['a']['x'][1]: cannot send a value of type set``), or an agent whose info is not a
            dict: the env's bug, not the caller's.
    """
    from marti.codec.env import infos_json

    for agent, info in infos.items():
        if not isinstance(info, Mapping):
            raise InternalError(
                f"env {env_id}'s {call} result cannot be sent: infos[{agent!r}] is of type {type(info).__name__}, "
                "not a dict"
            )
    parts = [(f"observations[{a!r}]", obs) for a, obs in observations.items()]
    if infos_json(infos) is None:
        parts += [(f"infos[{a!r}]", info) for a, info in infos.items()]
    for name, value in parts:
        try:
            check_wire_value(value, name)
        except InvalidArgumentError as e:
            raise InternalError(f"env {env_id}'s {call} result cannot be sent: {e.message}") from None


def check_reset_result(env_id: str, result: Any) -> tuple[dict, dict]:
    """Check what an env's ``reset`` returned against PettingZoo's parallel API (see :func:`check_step_result`).

    Returns:
        ``result`` as a tuple ``(observations, infos)``.

    Raises:
        InternalError: ``result`` is not two mappings, or ``infos`` is not keyed by the agents of
            ``observations``; the env and both agent lists are named.
    """
    return _check_parts(env_id, "reset", _RESET_PARTS, result)  # type: ignore[return-value]


def check_step_result(env_id: str, result: Any) -> tuple[dict, dict, dict, dict, dict]:
    """Check what an env's ``step`` returned against PettingZoo's parallel API, the same in process and on the
    env server (which would otherwise fill a missing reward with 0.0 and drop an agent missing from
    ``observations``).

    Args:
        env_id: The env's id, named by the error.
        result: The step's return value.

    Returns:
        ``result`` as a tuple ``(observations, rewards, terminations, truncations, infos)``.

    Raises:
        InternalError: ``result`` is not five mappings; ``rewards``, ``terminations``, ``truncations`` or
            ``infos`` is not keyed by the agents of ``observations`` (both agent lists named); a reward is not a
            real number (the agent and value named). The env is named: it is the env's bug, not the caller's.
    """
    out = _check_parts(env_id, "step", _STEP_PARTS, result)
    for agent, reward in out[1].items():
        if not isinstance(reward, numbers.Real):
            raise InternalError(
                f"env {env_id}'s step returned rewards[{agent!r}] = {reward!r:.80} ({type(reward).__name__}); "
                "a reward must be a real number"
            )
    return out  # type: ignore[return-value]


def mark_vanished(
    live: list[str], after: list[str], result: tuple[dict, dict, dict, dict, dict]
) -> list[str]:
    """Mark truncated, in place, the agents a step reported on that left ``agents`` with neither flag set.

    An agent of ``live`` that has an observation in ``result`` but is not in ``after``, and whose termination
    and truncation flags are both unset, gets ``truncations[agent] = True`` (``terminations[agent]`` False) and
    ``infos[agent]["truncated_reason"] = VANISHED_REASON``. (An agent the step reports nothing on is not part
    of the step's answer, in-process or remote, and is left out.)

    Args:
        live: Agents live before the step.
        after: Agents live after it.
        result: The step's ``(observations, rewards, terminations, truncations, infos)``, changed in place.

    Returns:
        The agents marked.
    """
    obs, _, terms, truncs, infos = result
    still = set(after)
    gone = [a for a in live if a in obs and a not in still and not terms.get(a) and not truncs.get(a)]
    for a in gone:
        terms[a] = False
        truncs[a] = True
        info = infos.get(a)
        infos[a] = {**(info if isinstance(info, Mapping) else {}), "truncated_reason": VANISHED_REASON}
    return gone


class GuardedParallelEnv(ParallelEnv):
    """A ``ParallelEnv`` that checks every ``step`` before the wrapped env sees it.

    Checks, in order: the env is not closed (``FailedPreconditionError``, as a closed remote env); ``actions``
    is a dict of agent name -> action (:func:`check_actions`); the episode is running
    (``FailedPreconditionError`` before the first ``reset`` and after the last step); no unknown agent
    (``InvalidArgumentError`` naming it); no agent that is done (named); no missing action for an acting agent
    unless the env declares ``missing_action`` (then it is filled in); text actions are ``str`` of at most
    ``max_action_chars`` characters (the error names the limit); other actions lie in the agent's action space.
    Actions of agents that are not acting this turn (per the env's ``acting_agents``) are accepted and passed
    through. ``reset`` checks ``seed`` (:func:`check_seed`) and ``options`` (:func:`check_options`).

    What the wrapped env's ``reset`` and ``step`` return is checked against PettingZoo's parallel API
    (:func:`check_reset_result`, :func:`check_step_result`: ``InternalError`` naming the env), and against what
    an env server can send (:func:`check_sendable_result`: ``InternalError`` naming the env and the key path),
    in process as in a server session.

    After a step, an agent the wrapped env removed from ``agents`` with neither its termination nor its
    truncation flag set (a game that ends by emptying ``agents``) is reported truncated, with
    ``infos[agent]["truncated_reason"] = VANISHED_REASON``, so every agent's last step says it is done.

    Args:
        env: The environment (a fresh instance; the guard owns it).
        max_action_chars: Length limit of text actions, in characters.
        env_id: The env's id, named by the error of a call after :meth:`close`.
    """

    def __init__(
        self, env: ParallelEnv, max_action_chars: int = DEFAULT_MAX_ACTION_CHARS, env_id: str = ""
    ) -> None:
        self.env = env
        self.max_action_chars = max_action_chars
        self.possible_agents = list(env.possible_agents)
        self.metadata = dict(getattr(env, "metadata", {}) or {})
        self.env_id = env_id or str(self.metadata.get("name") or type(env).__name__)
        self._started = False
        self._closed = False

    @property
    def agents(self) -> list[str]:
        """Live agents of the wrapped env."""
        return self.env.agents

    @property
    def acting_agents(self) -> list[str]:
        """Agents whose actions count this turn (all live agents when the env does not say)."""
        return list(getattr(self.env, "acting_agents", self.env.agents))

    def observation_space(self, agent: str) -> gymnasium.Space:
        """Return the wrapped env's observation space for ``agent``.

        Raises:
            InvalidArgumentError: ``agent`` is not one of ``possible_agents`` (named).
        """
        return self.env.observation_space(check_agent(agent, self.possible_agents))

    def action_space(self, agent: str) -> gymnasium.Space:
        """Return the wrapped env's action space for ``agent``.

        Raises:
            InvalidArgumentError: ``agent`` is not one of ``possible_agents`` (named).
        """
        return self.env.action_space(check_agent(agent, self.possible_agents))

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        """Reset the wrapped env; see ``ParallelEnv.reset``.

        Raises:
            FailedPreconditionError: The env is closed.
            InvalidArgumentError: ``seed`` is not an int64 or ``None``, or ``options`` not a sendable dict.
            InternalError: The wrapped env returned what PettingZoo's API does not allow (:func:`check_reset_result`)
                or what an env server cannot send (:func:`check_sendable_result`).
        """
        if self._closed:
            raise closed_error(self.env_id)
        seed = check_seed(seed)
        options = check_options(options)
        out = check_reset_result(self.env_id, self.env.reset(seed=seed, options=options))
        check_sendable_result(self.env_id, "reset", *out)
        self._started = True
        return out

    def check(self, actions: Any) -> dict[str, Any]:
        """Validate ``actions`` and return the dict the wrapped env will get.

        Raises:
            FailedPreconditionError: The env is closed, or no episode is running.
            InvalidArgumentError: See the class docstring; the message names the agent, value or limit.
        """
        if self._closed:
            raise closed_error(self.env_id)
        check_actions(actions)
        if not self._started:
            raise FailedPreconditionError("step before reset: call reset first")
        if not self.env.agents:
            raise FailedPreconditionError("the episode is over (no live agents): call reset")
        live = set(self.env.agents)
        for agent in actions:
            check_agent(agent, self.possible_agents)
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
            PettingZoo ``(observations, rewards, terminations, truncations, infos)``; an agent the env removed
            without a flag is truncated (see the class docstring).

        Raises:
            FailedPreconditionError, InvalidArgumentError: Bad ``actions`` or call (:meth:`check`).
            InternalError: The wrapped env returned what PettingZoo's API does not allow
                (:func:`check_step_result`), or what an env server cannot send
                (:func:`check_sendable_result`).
        """
        checked = self.check(actions)
        live = list(self.env.agents)
        out = check_step_result(self.env_id, self.env.step(checked))
        mark_vanished(live, self.env.agents, out)
        check_sendable_result(self.env_id, "step", out[0], out[4])
        return out

    def render(self) -> Any:
        """Render the wrapped env."""
        return self.env.render()

    def close(self) -> None:
        """Close the wrapped env (idempotent); every later ``reset`` or ``step`` raises
        ``FailedPreconditionError``."""
        if self._closed:
            return
        self._closed = True
        self.env.close()


def declared_metrics(env: Any) -> tuple[str, ...]:
    """The episode metrics an env declares (``env.metadata["metrics"]``; remote envs get them from the server).

    Args:
        env: Any ``ParallelEnv`` (local, remote, or a custom one by import path).

    Returns:
        The metric names, in the env's order; ``()`` when it declares none.

    Raises:
        InvalidArgumentError: ``metadata["metrics"]`` is not a list or tuple of strings (the env is named).
    """
    metadata = getattr(env, "metadata", None) or {}
    names = metadata.get("metrics", ()) if isinstance(metadata, Mapping) else ()
    if (
        isinstance(names, str)
        or not isinstance(names, Sequence)
        or not all(isinstance(n, str) for n in names)
    ):
        raise InvalidArgumentError(
            f"{type(env).__name__}.metadata['metrics'] must be a tuple of info key names, got {names!r}"
        )
    return tuple(names)
