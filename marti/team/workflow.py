"""Define a team's behaviour without touching the framework: roles, prompts, parsers, who acts when, rewards.

The environment stays authoritative for the rules of the game (what an action means, when the episode ends,
its own rewards). A :class:`Workflow` decides, on the trainer side:

* **who speaks at each turn** (``next_speakers(state) -> list[agent]``): the env's choice (agents whose info
  says ``is_acting``), a sequential chain, parallel workers then an aggregator, debate rounds then an
  aggregator, or any user function;
* **how an agent's prompt is built** (:class:`Role`: a system prompt template and a ``build_prompt`` function
  of the observation and the teammates' messages, which may also choose how the turn's reply starts
  (:class:`TurnPrompt`); the chat messages are rendered with the chat template of the agent's own model by the
  rollout engine);
* **how its text becomes an action** (``Role.parser``: text -> env action text);
* **whether it is a model at all** (``Role.policy``: a scripted agent, a Python callable that answers instead
  of a model; it is never trained);
* **how rewards are computed and allocated** (``reward_fn(episode) -> {agent: reward}`` and
  :class:`RewardAllocation`).

Each turn, every speaker's action goes to the env in one ``step``; speakers the env is not waiting for
(``is_acting`` false) still speak to the team through the broker, but built-in envs ignore their action.
Custom environments are registered by import path: ``environment.env_name: "my_pkg.envs:make_env"`` (or
``"path/to/file.py:make_env"``), a callable ``factory(config: dict, seed: int | None) -> ParallelEnv``; such
envs run in the trainer process (see :func:`make_custom_env`).

YAML form (``workflow:`` section of the training config, see ``docs/workflows.md``)::

    workflow:
      kind: chain                  # env | chain | parallel_aggregate | debate | custom
      order: [planner, executor, evaluator]
      roles:
        - {agent: evaluator, parser: "my_pkg.parsers:verdict"}
        - {agent: executor, scripted: "my_pkg.bots:greedy_executor"}
      reward_fn: "my_pkg.rewards:team_bonus"

or ``workflow: {factory: "my_pkg.team:build"}`` where ``build(cfg) -> Workflow`` uses this module directly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from marti.errors import InvalidArgumentError, MartiError, with_context
from marti.plumbing.loader import load_attr
from marti.team.prompt_template import check_prompt_template

__all__ = [
    "ConfigHook",
    "EpisodeView",
    "PromptContext",
    "RewardAllocation",
    "Role",
    "TurnPrompt",
    "Workflow",
    "WorkflowState",
    "check_workflow_section",
    "is_import_path",
    "load_callable",
    "make_custom_env",
]

#: Chat messages of one prompt: ``[{"role": "system", "content": ...}, {"role": "user", "content": ...}]``.
Chat = list[dict[str, str]]


def is_import_path(text: str | None) -> bool:
    """True if ``text`` looks like ``module.sub:attr`` or ``path/file.py:attr`` (an import path)."""
    return bool(text) and ":" in text and not text.startswith(":") and not text.endswith(":")


def load_callable(spec: str) -> Callable[..., Any]:
    """Import a callable named by an import path.

    Args:
        spec: ``"package.module:attr"`` (``attr`` may be dotted, ``Class.method``) or ``"path/to/file.py:attr"``
            (a path relative to the working directory, or absolute). The working directory is put on
            ``sys.path`` so modules next to the config can be imported.

    Returns:
        The object named by ``attr``; it must be callable.

    Raises:
        InvalidArgumentError: ``spec`` is not ``module:attr``, names something that is not callable, or names a
            module or file that fails to run (a syntax error, a failed import inside it; file and line named).
        NotFoundError: The module, file or attribute does not exist (named).
    """
    obj = load_attr(spec, files=True, form="'package.module:name' or 'file.py:name'")
    if not callable(obj):
        raise InvalidArgumentError(
            f"import path {spec!r} names a value of type {type(obj).__name__}, not a callable"
        )
    return obj


@dataclass(frozen=True)
class ConfigHook:
    """A workflow hook the config names by import path (:func:`workflow_from_section`): called as ``fn``; an error
    it raises names it by its config key and path (``workflow.roles.0.parser 'my.py:parse'``).

    Attributes:
        fn: The loaded callable.
        key: The config key, ``workflow.reward_fn`` or ``workflow.roles.N.parser``.
        path: The import path the key holds.
    """

    fn: Callable[..., Any]
    key: str
    path: str

    def __call__(self, *args: Any) -> Any:
        """``fn(*args)``."""
        return self.fn(*args)


def _hook_name(fn: Callable[..., Any], what: str) -> str:
    """How an error names hook ``fn``: its config key and import path (a :class:`ConfigHook`), else ``what`` and
    the callable's ``module:qualname``."""
    if isinstance(fn, ConfigHook):
        return f"{fn.key} {fn.path!r}"
    return f"{what} {getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"


def _call_hook(fn: Callable[..., Any], name: str, *args: Any) -> Any:
    """``fn(*args)``; an exception it raises becomes a typed error whose message starts with ``name`` (the hook,
    :func:`_hook_name`, and where it ran).

    Raises:
        InvalidArgumentError: ``fn`` raised a non-marti exception (its class and message named, chained).
        MartiError: ``fn`` raised a marti error: the same class, its message prefixed with ``name``.
    """
    try:
        return fn(*args)
    except MartiError as exc:
        raise with_context(exc, name) from exc
    except Exception as exc:
        raise InvalidArgumentError(f"{name} raised {type(exc).__name__}: {exc}") from exc


def make_custom_env(spec: str, config: Mapping[str, Any], seed: int | None) -> Any:
    """Build a user environment registered by import path.

    Args:
        spec: Import path of ``factory(config: dict, seed: int | None) -> ParallelEnv`` (a class works too).
        config: The env config (the trainer passes ``max_turns``, ``num_agents``, ``roles`` and
            ``environment.options``; keys the factory does not know it may ignore or reject).
        seed: Seed of the first ``reset`` without a seed.

    Returns:
        The env (PettingZoo ``ParallelEnv`` semantics: ``possible_agents``, ``agents``, ``reset``, ``step``,
        ``close``).

    Raises:
        NotFoundError / InvalidArgumentError: see :func:`load_callable`.
        InvalidArgumentError: The factory returned something without ``reset``/``step``.
    """
    env = load_callable(spec)(dict(config), seed)
    for name in ("reset", "step", "possible_agents"):
        if not hasattr(env, name):
            raise InvalidArgumentError(f"custom env {spec!r} returned {type(env).__name__} without {name!r}")
    return env


@dataclass
class PromptContext:
    """What an agent's prompt is built from.

    Attributes:
        agent: The agent being prompted.
        role: Its role name.
        observation: Its env observation text this turn.
        messages: ``(sender, text)`` of the teammates' messages received since its last turn (over the
            broker; in order).
        step: Turn index in the episode (0-based).
        info: Its env info dict this turn.
    """

    agent: str
    role: str
    observation: str
    messages: list[tuple[str, str]]
    step: int
    info: dict[str, Any]


@dataclass(frozen=True)
class TurnPrompt:
    """What a role's ``build_prompt`` may return instead of a ``str``: the user message and how this turn's reply
    starts.

    ``reply_start`` is prefilled for this one turn as the agent's ``response_prefix`` is for every turn, after it
    (the prompt ends with the chat template's output, then the tokens of ``response_prefix + reply_start``): those
    tokens are prompt tokens, so they are never trained, and the reply's text (what the parser and the env get)
    starts with ``response_prefix + reply_start``. A scripted agent's answer is prefixed with it likewise.
    (Named ``TurnPrompt``, not ``Prompt``: :data:`marti.types.inference.Prompt` is the engines' prompt type.)

    Args:
        user: The user message.
        reply_start: Text the reply starts with (e.g. ``"I can do 3 tasks: task_"``); ``""``: none.

    Raises:
        InvalidArgumentError: ``user`` or ``reply_start`` is not a ``str`` (its type named).
    """

    user: str
    reply_start: str = ""

    def __post_init__(self) -> None:
        for name in ("user", "reply_start"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise InvalidArgumentError(f"TurnPrompt.{name} must be a str, got {type(value).__name__}")


def default_build_prompt(ctx: PromptContext) -> str:
    """The built-in user message: the observation, then ``Messages from your teammates:`` and one
    ``[sender]: text`` line per message (what :class:`services.trainer.rollout.episodes.runner.EpisodeRunner` does)."""
    if not ctx.messages:
        return ctx.observation
    lines = "\n".join(f"[{s}]: {t}" for s, t in ctx.messages)
    return f"{ctx.observation}\nMessages from your teammates:\n{lines}"


@dataclass(frozen=True)
class Role:
    """How one agent is prompted, how its text is read, and whether a model or a script plays it.

    Args:
        agent: Agent name (as in the config's ``agents`` list).
        system_prompt: System prompt template (``{name}``, ``{role}``, ``{capabilities}`` filled in); None keeps
            the agent's ``prompt_template`` / the built-in one.
        build_prompt: ``build_prompt(PromptContext) -> str | TurnPrompt``: the user message, or a
            :class:`TurnPrompt` (the user message and how the turn's reply starts); None uses
            :func:`default_build_prompt`.
        parser: ``parser(text) -> action``: turns the agent's reply into the env action (e.g. extract
            ``offer: 40``); None sends the text unchanged. It must not raise: return the text on failure (an
            exception stops the job, :meth:`Workflow.action`).
        policy: A scripted agent: ``policy(chat: list[dict]) -> str`` replies instead of a model; such an agent
            records no trainable turns.

    Raises:
        InvalidArgumentError: A ``system_prompt`` with a placeholder other than ``{name}``, ``{role}``,
            ``{capabilities}``, or braces that do not pair up (:func:`marti.team.prompt_template.check_prompt_template`).
    """

    agent: str
    system_prompt: str | None = None
    build_prompt: Callable[[PromptContext], str | TurnPrompt] | None = None
    parser: Callable[[str], str] | None = None
    policy: Callable[[Chat], str] | None = None

    def __post_init__(self) -> None:
        """Refuse a ``system_prompt`` that cannot be filled in (:func:`marti.team.prompt_template.check_prompt_template`).

        Raises:
            InvalidArgumentError: Naming the agent and the bad placeholder or brace.
        """
        if self.system_prompt is not None:
            try:
                check_prompt_template(self.system_prompt)
            except ValueError as exc:
                raise InvalidArgumentError(f"Role {self.agent!r}: system_prompt: {exc}") from None

    def turn_prompt(self, ctx: PromptContext) -> TurnPrompt:
        """This turn's user message and reply start: ``build_prompt(ctx)`` (:func:`default_build_prompt` if
        none), a ``str`` being a :class:`TurnPrompt` without a reply start.

        Raises:
            InvalidArgumentError: ``build_prompt`` returned neither a ``str`` nor a :class:`TurnPrompt` (the
                agent, its role and the type named).
        """
        built = (self.build_prompt or default_build_prompt)(ctx)
        if isinstance(built, TurnPrompt):
            return built
        if isinstance(built, str):
            return TurnPrompt(built)
        raise InvalidArgumentError(
            f"the prompt builder of agent {self.agent!r} (role {ctx.role!r}) returned {type(built).__name__}; "
            "it must return a str (the user message) or a marti.team.workflow.TurnPrompt"
        )


@dataclass
class WorkflowState:
    """What ``next_speakers`` sees at the start of a turn.

    Attributes:
        step: Turn index in the episode (0-based).
        agents: Agents still in the episode (the env's ``agents``).
        env_acting: Agents whose info says ``is_acting`` (the env's own choice; empty if the env does not say).
        observations: Per agent, its observation text.
        infos: Per agent, its env info.
        transcript: ``(step, agent, text)`` of every reply so far, in order.
        task: Task name of a multi-task job, else None.
    """

    step: int
    agents: list[str]
    env_acting: list[str]
    observations: dict[str, Any]
    infos: dict[str, dict[str, Any]]
    transcript: list[tuple[int, str, str]] = field(default_factory=list)
    task: str | None = None


@dataclass
class EpisodeView:
    """A finished episode, as custom reward functions see it.

    Attributes:
        agents: The team.
        transcript: ``(step, agent, text)`` of every reply (texts as generated, before parsing).
        env_returns: Per agent, the sum of the env's rewards.
        metrics: The env's final metrics (``task_completion``, ...) and runner counters.
        final_infos: Per agent, the last env info.
        seed: Problem seed.
        task: Task name, or None.
    """

    agents: list[str]
    transcript: list[tuple[int, str, str]]
    env_returns: dict[str, float]
    metrics: dict[str, float]
    final_infos: dict[str, dict[str, Any]]
    seed: int
    task: str | None = None


@dataclass(frozen=True)
class RewardAllocation:
    """How the env's returns and a custom reward combine into each agent's training reward.

    With ``e_a`` the env return, ``c_a`` the custom reward (0 without ``reward_fn``) and ``r_a = env_weight * e_a
    + custom_weight * c_a``, agent ``a`` is credited ``(1 - team_share) * r_a + team_share * mean_b(r_b)``:
    ``team_share = 0`` keeps rewards individual, ``1`` gives every agent the team mean.

    Args:
        env_weight: Weight of the env's return, >= 0.
        custom_weight: Weight of ``reward_fn``'s value, >= 0.
        team_share: Fraction of the team mean mixed into each agent's reward, in [0, 1].

    Raises:
        InvalidArgumentError: A weight is negative, ``team_share`` is outside [0, 1], or both weights are 0.
    """

    env_weight: float = 1.0
    custom_weight: float = 1.0
    team_share: float = 0.0

    def __post_init__(self) -> None:
        if self.env_weight < 0 or self.custom_weight < 0:
            raise InvalidArgumentError(
                f"reward weights must be >= 0, got env_weight={self.env_weight}, "
                f"custom_weight={self.custom_weight}"
            )
        if self.env_weight == 0 and self.custom_weight == 0:
            raise InvalidArgumentError("env_weight and custom_weight are both 0: no reward left")
        if not 0.0 <= self.team_share <= 1.0:
            raise InvalidArgumentError(f"team_share must be in [0, 1], got {self.team_share}")

    def apply(self, env_returns: Mapping[str, float], custom: Mapping[str, float] | None) -> dict[str, float]:
        """Combine rewards (see the class docstring).

        Args:
            env_returns: Per agent, its env return.
            custom: Per agent, the custom reward; agents absent get 0. None: no custom reward.

        Returns:
            Per agent of ``env_returns`` (and of ``custom``), its credited reward.

        Raises:
            InvalidArgumentError: ``custom`` has a non-finite or non-numeric value (named).
        """
        from marti.rewards.base import check_reward, is_finite_real  # marti.rewards imports this module

        custom = dict(custom or {})
        agents = list(dict.fromkeys([*env_returns, *custom]))
        raw: dict[str, float] = {}
        for a in agents:
            c = custom.get(a, 0.0)
            if not is_finite_real(c):
                raise InvalidArgumentError(
                    f"reward_fn gave agent {a!r} the reward {c!r} ({type(c).__name__}); need a finite real number "
                    "(int, float or a numpy scalar; not a bool, text or a tensor: use .item())"
                )
            check_reward(float(c), f"reward_fn's reward for agent {a!r}")
            raw[a] = self.env_weight * float(env_returns.get(a, 0.0)) + self.custom_weight * float(c)
        if not raw:
            return {}
        mean = sum(raw.values()) / len(raw)
        return {a: (1 - self.team_share) * r + self.team_share * mean for a, r in raw.items()}


SpeakerFn = Callable[[WorkflowState], Sequence[str]]


class Workflow:
    """Who acts when, with roles and rewards. Build one with a class method or pass ``next_speakers``.

    Args:
        next_speakers: ``next_speakers(state) -> agents`` called at the start of every turn; the agents reply
            in that turn (in one batch per agent). Unknown agents are an error; an empty list passes the turn
            to the env's choice.
        roles: Per agent, its :class:`Role` (agents without one use the defaults).
        reward_fn: ``reward_fn(EpisodeView) -> {agent: reward}`` called once per finished episode.
        allocation: How env returns and ``reward_fn`` combine (:class:`RewardAllocation`).
        name: Kind, for logs (``env``, ``chain``, ``parallel_aggregate``, ``debate``, ``custom``).
    """

    def __init__(
        self,
        next_speakers: SpeakerFn | None = None,
        *,
        roles: Sequence[Role] | Mapping[str, Role] = (),
        reward_fn: Callable[[EpisodeView], Mapping[str, float]] | None = None,
        allocation: RewardAllocation | None = None,
        name: str = "custom",
    ) -> None:
        self._next = next_speakers
        items = roles.values() if isinstance(roles, Mapping) else roles
        self.roles: dict[str, Role] = {}
        for r in items:
            if r.agent in self.roles:
                raise InvalidArgumentError(f"two roles for agent {r.agent!r}")
            self.roles[r.agent] = r
        self.reward_fn = reward_fn
        self.allocation = allocation or RewardAllocation()
        self.name = name

    # ----------------------------------------------------------------------------------------- kinds
    @classmethod
    def env(cls, **kwargs: Any) -> Workflow:
        """The env decides: the speakers are the agents whose info says ``is_acting`` (the default path)."""
        return cls(None, name="env", **kwargs)

    @classmethod
    def chain(cls, order: Sequence[str], **kwargs: Any) -> Workflow:
        """Sequential chain: turn ``t`` is ``order[t % len(order)]`` (planner -> executor -> evaluator -> ...).

        Raises:
            InvalidArgumentError: ``order`` is empty.
        """
        seq = _nonempty(order, "chain order")
        return cls(lambda s: [seq[s.step % len(seq)]], name="chain", **kwargs)

    @classmethod
    def parallel_then_aggregate(cls, workers: Sequence[str], aggregator: str, **kwargs: Any) -> Workflow:
        """All ``workers`` reply at once, then ``aggregator`` (seeing their messages); repeats every 2 turns.

        Raises:
            InvalidArgumentError: ``workers`` is empty or contains the aggregator.
        """
        ws = _nonempty(workers, "workers")
        if aggregator in ws:
            raise InvalidArgumentError(f"aggregator {aggregator!r} is also listed among the workers {ws}")
        return cls(lambda s: ws if s.step % 2 == 0 else [aggregator], name="parallel_aggregate", **kwargs)

    @classmethod
    def debate(cls, solvers: Sequence[str], aggregator: str, rounds: int = 2, **kwargs: Any) -> Workflow:
        """``rounds`` rounds in which all solvers answer (each seeing the others' last answers), then the
        aggregator; turn ``t`` is a solver round when ``t % (rounds + 1) < rounds``.

        Raises:
            InvalidArgumentError: ``rounds < 1``, no solvers, or the aggregator is a solver.
        """
        ss = _nonempty(solvers, "solvers")
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
            raise InvalidArgumentError(f"debate rounds must be an int >= 1, got {rounds!r}")
        if aggregator in ss:
            raise InvalidArgumentError(f"aggregator {aggregator!r} is also listed among the solvers {ss}")
        return cls(lambda s: ss if s.step % (rounds + 1) < rounds else [aggregator], name="debate", **kwargs)

    # ----------------------------------------------------------------------------------------- use
    @property
    def env_decides(self) -> bool:
        """True when the env's ``is_acting`` picks the speakers every turn."""
        return self._next is None

    def speakers(self, state: WorkflowState) -> list[str]:
        """The agents that reply this turn.

        Args:
            state: The turn's :class:`WorkflowState`.

        Returns:
            Distinct agents, in order; the env's ``is_acting`` agents when this workflow does not decide or its
            function returned nothing.

        Raises:
            InvalidArgumentError: The function named an agent not in the episode (named).
        """
        if self._next is None:
            return list(state.env_acting)
        chosen = list(dict.fromkeys(self._next(state) or ()))
        unknown = [a for a in chosen if a not in state.agents]
        if unknown:
            raise InvalidArgumentError(
                f"workflow {self.name!r} chose {unknown} at step {state.step}; agents are {state.agents}"
            )
        return chosen or list(state.env_acting)

    def role(self, agent: str) -> Role:
        """The agent's :class:`Role` (a default one if none was given)."""
        return self.roles.get(agent) or Role(agent)

    def scripted_agents(self) -> list[str]:
        """Agents played by a Python callable instead of a model."""
        return [a for a, r in self.roles.items() if r.policy is not None]

    def action(self, agent: str, text: str) -> str:
        """The env action of ``agent``'s reply ``text``: its role's parser's answer as text, or ``text`` itself
        when the role has no parser.

        Raises:
            InvalidArgumentError / MartiError: The parser raised: the message names the parser (its config key
                and import path, :class:`ConfigHook`), the agent and the exception (chained), as
                :func:`_call_hook` words it.
        """
        parser = self.role(agent).parser
        if parser is None:
            return text
        return str(_call_hook(parser, f"{_hook_name(parser, 'parser')} of agent {agent!r}", text))

    def rewards(self, episode: EpisodeView) -> dict[str, float]:
        """Each agent's credited reward for a finished episode (``reward_fn`` + :class:`RewardAllocation`).

        Without a ``reward_fn`` and with the identity allocation (``env_weight`` 1, ``team_share`` 0) these are
        the env returns, unchanged (the default workflow of the episode runner).

        Raises:
            InvalidArgumentError: ``reward_fn`` returned something other than a mapping of finite numbers, or
                a key that is not one of ``episode.agents`` (the keys and the agents named; a typo or a
                "judge" would otherwise be credited as an extra agent and shift every team share), or it raised
                (named by its config key and import path, with the exception, chained: :func:`_call_hook`; a
                marti error it raises keeps its class).
        """
        if self.reward_fn is None and self.allocation.env_weight == 1.0 and self.allocation.team_share == 0.0:
            return dict(episode.env_returns)
        custom = None
        if self.reward_fn is not None:
            custom = _call_hook(self.reward_fn, _hook_name(self.reward_fn, "reward_fn"), episode)
            if not isinstance(custom, Mapping):
                raise InvalidArgumentError(
                    f"reward_fn returned {type(custom).__name__}; need a dict agent -> reward"
                )
            _check_reward_keys(custom, episode.agents)
        return self.allocation.apply(episode.env_returns, custom)


def _check_reward_keys(custom: Mapping[str, Any], agents: Sequence[str]) -> None:
    """Refuse reward keys that are not agents of the episode.

    Raises:
        InvalidArgumentError: Some keys of ``custom`` are not in ``agents`` (both named).
    """
    unknown = [k for k in custom if k not in agents]
    if unknown:
        raise InvalidArgumentError(
            f"reward_fn returned rewards for {unknown}, which are not agents of the episode; agents are "
            f"{list(agents)} (an agent it leaves out gets 0)"
        )


def _nonempty(agents: Sequence[str], what: str) -> list[str]:
    out = list(agents)
    if not out:
        raise InvalidArgumentError(f"{what} must name at least one agent")
    return out


def check_workflow_section(section: Any, agent_names: Sequence[str]) -> None:
    """Check a config's ``workflow`` section without running any of its user code, so that ``marti train`` can
    refuse a bad one before it touches the run folder: every import path it names is loaded (a ``factory`` is
    loaded, not called), and without a ``factory`` the workflow is built as :func:`workflow_from_section` builds
    it (agent names and each kind's fields checked).

    Args:
        section: The ``workflow`` section (``marti.config.WorkflowConfig``).
        agent_names: The team, in config order.

    Raises:
        NotFoundError / InvalidArgumentError: An import path that does not load (what :func:`load_callable`
            raises, its message prefixed with the config key, ``workflow.reward_fn`` or
            ``workflow.roles.0.parser``), or what :func:`workflow_from_section` raises.
    """
    keys = ["factory"] if section.factory else ["next_speakers", "reward_fn"]
    paths = [(f"workflow.{k}", getattr(section, k)) for k in keys]
    if not section.factory:
        for i, r in enumerate(section.roles):
            paths += [
                (f"workflow.roles.{i}.{k}", getattr(r, k)) for k in ("prompt_builder", "parser", "scripted")
            ]
    for key, path in paths:
        if path:
            try:
                load_callable(path)
            except MartiError as exc:
                raise with_context(exc, key) from exc
    if not section.factory:
        workflow_from_section(section, agent_names)


def workflow_from_section(section: Any, agent_names: Sequence[str], cfg: Any = None) -> Workflow:
    """Build a :class:`Workflow` from the config's ``workflow`` section (see ``marti.config.WorkflowConfig``).

    Args:
        section: The ``workflow`` section.
        agent_names: The team, in config order (names in the section must be among them).
        cfg: The whole training config, passed to a ``factory``.

    Returns:
        The workflow (``Workflow.env()`` with roles/rewards when ``kind`` is ``env``).

    Raises:
        InvalidArgumentError: A name is not an agent, or the kind's fields are missing (named).
        NotFoundError: An import path does not resolve.
    """
    if section.factory:
        wf = load_callable(section.factory)(cfg)
        if not isinstance(wf, Workflow):
            raise InvalidArgumentError(
                f"workflow.factory {section.factory!r} returned {type(wf).__name__}, not marti.team.workflow.Workflow"
            )
        return wf
    names = list(agent_names)
    named = [("workflow.order", a) for a in section.order]
    for key, a in [*named, *([("workflow.aggregator", section.aggregator)] if section.aggregator else [])]:
        if a not in names:
            raise InvalidArgumentError(f"{key} names agent {a!r}, which is not in agents {names}")
    roles = []
    for i, r in enumerate(section.roles):
        if r.agent not in names:
            raise InvalidArgumentError(
                f"workflow.roles names agent {r.agent!r}, which is not in agents {names}"
            )
        roles.append(
            Role(
                r.agent,
                system_prompt=r.system_prompt,
                build_prompt=load_callable(r.prompt_builder) if r.prompt_builder else None,
                parser=_config_hook(r.parser, f"workflow.roles.{i}.parser"),
                policy=load_callable(r.scripted) if r.scripted else None,
            )
        )
    kwargs: dict[str, Any] = {
        "roles": roles,
        "reward_fn": _config_hook(section.reward_fn, "workflow.reward_fn"),
        "allocation": RewardAllocation(
            section.reward_env_weight, section.reward_custom_weight, section.reward_team_share
        ),
    }
    kind = section.kind
    if kind == "env":
        return Workflow.env(**kwargs)
    if kind == "chain":
        return Workflow.chain(section.order or names, **kwargs)
    if kind == "custom":
        if not section.next_speakers:
            raise InvalidArgumentError("workflow.kind=custom needs workflow.next_speakers (an import path)")
        return Workflow(load_callable(section.next_speakers), name="custom", **kwargs)
    if not section.aggregator:
        raise InvalidArgumentError(f"workflow.kind={kind} needs workflow.aggregator")
    others = section.order or [a for a in names if a != section.aggregator]
    if kind == "parallel_aggregate":
        return Workflow.parallel_then_aggregate(others, section.aggregator, **kwargs)
    return Workflow.debate(others, section.aggregator, rounds=section.rounds, **kwargs)


def _config_hook(path: str | None, key: str) -> ConfigHook | None:
    """The callable config key ``key`` names by import path ``path`` (loaded: :func:`load_callable`), or None
    without a path."""
    return ConfigHook(load_callable(path), key, path) if path else None
