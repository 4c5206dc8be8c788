"""Play multi-agent episodes: env_server sessions, agents' turns from the rollout engine, messages over
comm_broker, one :class:`marti.types.trajectory.Trajectory` per agent and episode.

Several episodes are played in lockstep so each agent's turns are generated in one batch. There is one turn
loop, driven by a :class:`marti.team.workflow.Workflow` (the one hook, ``workflow=``): at every turn the workflow
picks each live episode's speakers, builds their prompts, answers for its scripted agents and parses replies
into actions; each agent's model prompts are generated together; then every env is stepped (remote sessions
that share a channel in one ``BatchStep`` round trip, :func:`marti.env.make.step_many`), and every reply is routed
to the teammates. When an episode ends its result is finished at once (metrics, the workflow's rewards) and
handed to ``on_episode_end``.

Without a workflow the runner uses the default one, ``Workflow.env()``: the speakers are the agents whose env
info says ``is_acting``, an agent's prompt is its system prompt and :func:`marti.team.workflow.default_build_prompt`
(its env observation, then the messages its teammates sent it through comm_broker since its last turn; the
trainer runs the env with ``history_messages=0``, so the team's conversation reaches agents only through the
broker), no parser, no scripted agent, and the credited returns are the env's.

An episode's metrics are the ones its env declares (``metadata["metrics"]``, read after the last step, see
:func:`marti.env.make.declared_metrics`) plus the runner's counters :data:`RUNNER_METRIC_KEYS`.
``play(seeds, tasks=...)`` plays each episode on its own task (multi-task jobs; ``make_task_env(seed, task)``
builds its env).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from marti.env.make import declared_metrics, step_many
from marti.errors import InvalidArgumentError, MartiError
from marti.rewards.base import check_reward
from marti.team.prompt_template import fill_prompt_template
from marti.team.workflow import EpisodeView, PromptContext, Role, Workflow, WorkflowState
from marti.types.trajectory import Trajectory, Turn
from services.trainer.rollout.engines.base import shifted, too_long_prompt

_LOG = logging.getLogger(__name__)

#: Generate responses for one agent: ``(agent_id, chat prompts) -> generations`` (see
#: rollout.engines.base.Generation); when a turn's prompt builder gives a reply start (:class:`marti.team.workflow.TurnPrompt`)
#: it is called ``(agent_id, chats, reply_starts)``, one reply start per chat (``""``: none), and each generation's
#: text must start with its reply start (:func:`~services.trainer.rollout.engines.generation.generate_turns`).
GenerateFn = Callable[..., list[Any]]
#: Build a comm client for (agent_id, session) exposing send_message / get_messages / broadcast_state / close.
CommFactory = Callable[[str, str], Any]

#: The system prompt of an agent without a ``prompt_template`` (see :func:`agent_system_prompt`).
DEFAULT_SYSTEM_PROMPT = (
    "You are {name}, the {role} of a team of AI agents. Answer briefly and exactly in the requested format."
)


def agent_system_prompt(agent: Any) -> str:
    """An agent's system prompt (an :class:`marti.config.AgentConfig`): its ``prompt_template``, else
    :data:`DEFAULT_SYSTEM_PROMPT`, with ``{name}``, ``{role}`` and ``{capabilities}`` (comma-separated) filled in."""
    template = agent.prompt_template or DEFAULT_SYSTEM_PROMPT
    return fill_prompt_template(
        template, name=agent.name, role=agent.role, capabilities=", ".join(agent.capabilities)
    )


def role_system_prompt(role: Role, default: str, role_name: str, capabilities: str) -> str:
    """The system prompt of ``role.agent``: the workflow role's ``system_prompt`` template with ``{name}``,
    ``{role}`` (``role_name``) and ``{capabilities}`` filled in, else ``default`` (its
    :func:`agent_system_prompt`)."""
    if not role.system_prompt:
        return default
    return fill_prompt_template(
        role.system_prompt, name=role.agent, role=role_name, capabilities=capabilities
    )


#: Counters the runner adds to every episode's metrics, after the env's own: the fraction of turns whose
#: action the env could read, the turns played and the broker messages received.
RUNNER_METRIC_KEYS = ("format_valid", "num_turns", "messages")


@dataclass
class EpisodeResult:
    """One finished episode.

    Attributes:
        episode_id: Unique id (also the comm_broker session of the episode).
        seed: Problem seed of the env.
        trajectories: Per agent, its record: the agents that acted at least once, plus the idle agents of the
            runner's :class:`RecordPlan` (a record without turns); with a plan each record is complete (see
            :class:`RecordPlan`).
        returns: Per agent, its credited return: the sum of its env rewards, re-credited by the workflow's
            ``reward_fn`` / allocation when it has one.
        metrics: The env's declared metrics (its ``metadata["metrics"]``, e.g. ``task_completion``) as they
            stood after the last step, then ``num_turns``, ``format_valid`` (fraction of turns whose action
            parsed) and ``messages`` (broker messages received).
        task: Task name in a multi-task job, else None.
        env_returns: Per agent, the env's own return (equal to ``returns`` unless a workflow re-credits them).
        transcript: ``(step, agent, text)`` of every reply (scripted agents' included), in order.
        team_answer: The team's extracted answer as the env's last info gives it (``team_answer``, the
            ``dataset_task`` env), else None; majority votes over sampled evaluations read it.
    """

    episode_id: str
    seed: int
    trajectories: dict[str, Trajectory] = field(default_factory=dict)
    returns: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    task: str | None = None
    env_returns: dict[str, float] = field(default_factory=dict)
    transcript: list[tuple[int, str, str]] = field(default_factory=list)
    team_answer: str | None = None


@dataclass(frozen=True)
class RecordPlan:
    """How the runner completes the records of a training rollout, once, before ``on_episode_end`` gets them.

    Every record then carries, as typed :class:`marti.types.trajectory.Trajectory` fields: its group (``group_id``,
    the episode's seed, ``task:seed`` in a multi-task job, with ``group_size``), its credited return
    (``episode_return``, the agent's return after the workflow and ``rescore``, mapped by ``credit``) and, as its
    ``policy_version``, the oldest version of its turns (the version at the episode's start when it has none).

    Attributes:
        agents: The agents that get a record every episode, one without turns when they did not act (the
            trainable agents: each episode adds one item to each of their tables).
        group_size: The members of each group (``rollout.group_size``; the store takes a group whole); >= 1.
        credit: Maps an agent's return to its record's ``episode_return`` (the job's ``team_weight`` scaling,
            :func:`services.trainer.rollout.episodes.env_config.agent_return`); None keeps it.
    """

    agents: tuple[str, ...]
    group_size: int = 1
    credit: Callable[[float], float] | None = None


def _complete(result: EpisodeResult, plan: RecordPlan) -> None:
    """Complete ``result``'s records by ``plan`` (see :class:`RecordPlan`); drop the idle ones it does not keep."""
    group = str(result.seed) if result.task is None else f"{result.task}:{result.seed}"
    done: dict[str, Trajectory] = {}
    for agent, traj in result.trajectories.items():
        if not traj.turns and agent not in plan.agents:
            continue
        ret = result.returns.get(agent, 0.0)
        traj.episode_return = plan.credit(ret) if plan.credit is not None else ret
        traj.group_id, traj.group_size = group, plan.group_size
        versions = [t.policy_version for t in traj.turns if t.policy_version is not None]
        if versions:
            traj.policy_version = min(versions)
        done[agent] = traj
    result.trajectories = done


#: Re-scores the views of the episodes that ended in one turn: one ``agent -> reward`` per view, in order.
RescoreFn = Callable[[list[EpisodeView]], list[dict[str, float]]]
#: Called with each finished episode, as soon as it ends (see :class:`EpisodeRunner`).
EpisodeEndHook = Callable[[EpisodeResult], None]


@dataclass
class _Live:
    env: Any
    seed: int
    episode_id: str
    obs: dict[str, str]
    infos: dict[str, dict[str, Any]]
    comms: dict[str, Any]
    result: EpisodeResult
    metric_keys: tuple[str, ...] = ()
    turns: int = 0
    parsed: int = 0
    received: int = 0
    done: bool = False
    finished: bool = False
    mailbox: dict[str, list[tuple[str, str]]] = field(default_factory=dict)


def _turn_info(env_info: dict[str, Any], gen: Any) -> dict[str, Any]:
    """A turn's ``info``: the env's scalar info entries plus ``policy_version``, the version of the weights that
    generated the response (also the turn's ``policy_version``; the learner measures staleness with it). A NaN or
    infinite float is written as None (JSON null, as the broker's payloads write it): the store refuses
    non-finite numbers, which JSON cannot carry."""
    out = {
        k: None if isinstance(v, float) and not math.isfinite(v) else v
        for k, v in env_info.items()
        if isinstance(v, (int, float, str, bool))
    }
    out["policy_version"] = int(getattr(gen, "policy_version", 0))
    return out


def _close_quietly(obj: Any) -> None:
    """Close a session client; a service that is down (the episode is being abandoned) only gets a log line."""
    try:
        obj.close()
    except MartiError as exc:
        _LOG.warning("closing %s failed: %s: %s", type(obj).__name__, type(exc).__name__, exc)


class EpisodeRunner:
    """Plays batches of episodes for a team of agents.

    Args:
        make_env: ``make_env(seed) -> ParallelEnv`` (local or remote, see :func:`marti.make`).
        generate: Generates one response per chat prompt for an agent (:data:`GenerateFn`: with the prompts'
            reply starts as a third argument when a turn's prompt builder gave one).
        comm_factory: Builds a comm_broker client for ``(agent_id, session)``; ``None`` plays without a broker
            (see ``local_mailbox``).
        agents: Agent names in env order (``possible_agents`` of the env are mapped by position).
        roles: Role per agent name.
        system_prompts: System prompt per agent name.
        policy_version: ``agent -> int`` current policy version (recorded in each trajectory).
        run_id: Prefix of the episode ids / broker sessions.
        workflow: A :class:`marti.team.workflow.Workflow` deciding speakers, prompts, parsers, scripts and rewards;
            None uses ``Workflow.env()`` (the env's ``is_acting`` agents speak, default prompts, env returns).
        make_task_env: ``make_task_env(seed, task) -> ParallelEnv`` for ``play(..., tasks=...)``.
        on_episode_end: Called with each episode's final :class:`EpisodeResult` (metrics and the workflow's
            rewards applied) as soon as it ends: inside the turn loop, right after the turn in which it ended
            (episodes ending in the same turn in the order of ``seeds``), or after the last turn for episodes cut
            by ``play``'s ``max_turns``; exactly once per episode of a ``play`` call. An exception it raises
            stops ``play`` (every session is still closed).
        local_mailbox: Without a broker, deliver each reply to the teammates' next prompts in-process. None
            (default): only when ``workflow`` is given; the plain runner without a broker then leaves the
            conversation to the env (pass env option ``history_messages > 0``), as it always did.
        capabilities: Per agent name, its capabilities as text (``"planning, coordination"``): what
            ``{capabilities}`` becomes in a workflow role's ``system_prompt`` template; missing agents get ``""``.
        rescore: ``rescore(views) -> [agent -> reward]``, called once with the views of the episodes that end
            in the same turn; each episode's rewards then replace its env returns before the workflow's
            ``reward_fn`` / allocation (a dataset job's reward scorers, :mod:`services.trainer.rollout.episodes.scoring`);
            metrics the hook adds to a view's ``metrics`` are reported with its episode. None: the env returns
            stand.
        records: A :class:`RecordPlan`: each record is completed by it before ``on_episode_end`` (a training
            rollout, whose records go to the agents' tables as they are). None: the records of the agents that
            acted, as played.
        describe_seed: ``describe_seed(seed) -> str``, how errors name an episode's problem (a dataset job: its
            row and file, :meth:`services.trainer.data.tasks.DatasetTasks.describe`); None: ``problem seed N``.
            A prompt the engine refuses as too long is named with it, the agent and the turn.
    """

    def __init__(
        self,
        make_env: Callable[[int], Any],
        generate: GenerateFn,
        comm_factory: CommFactory | None,
        agents: Sequence[str],
        roles: dict[str, str],
        system_prompts: dict[str, str],
        policy_version: Callable[[str], int],
        run_id: str = "run",
        workflow: Workflow | None = None,
        make_task_env: Callable[[int, str], Any] | None = None,
        on_episode_end: EpisodeEndHook | None = None,
        local_mailbox: bool | None = None,
        capabilities: dict[str, str] | None = None,
        rescore: RescoreFn | None = None,
        records: RecordPlan | None = None,
        describe_seed: Callable[[int], str] | None = None,
    ) -> None:
        self.make_env = make_env
        self.generate = generate
        self.comm_factory = comm_factory
        self.agents = list(agents)
        self.roles = roles
        self.system_prompts = system_prompts
        self.policy_version = policy_version
        self.run_id = run_id
        self.workflow = workflow if workflow is not None else Workflow.env()
        self.make_task_env = make_task_env
        self.on_episode_end = on_episode_end
        self.local_mailbox = (workflow is not None) if local_mailbox is None else bool(local_mailbox)
        self.capabilities = dict(capabilities or {})
        self.rescore = rescore
        self.records = records
        self.describe_seed = describe_seed or (lambda seed: f"problem seed {seed}")

    def _start(self, seed: int, task: str | None = None) -> _Live:
        if task is not None:
            if self.make_task_env is None:
                raise ValueError(f"episode of task {task!r} but the runner has no make_task_env")
            env = self.make_task_env(seed, task)
        else:
            env = self.make_env(seed)
        episode_id = f"{self.run_id}-{seed}-{uuid.uuid4().hex[:8]}"
        comms: dict[str, Any] = {}
        try:
            obs, infos = env.reset(seed=seed)
            if list(env.possible_agents) != self.agents:
                raise ValueError(
                    f"env agents {list(env.possible_agents)} differ from config agents {self.agents}"
                )
            metric_keys = declared_metrics(env)
            for a in self.agents if self.comm_factory else ():
                comms[a] = self.comm_factory(a, episode_id)
        except BaseException:
            for closable in (*comms.values(), env):
                _close_quietly(closable)
            raise
        result = EpisodeResult(episode_id, seed, task=task)
        for a in self.agents:
            result.returns[a] = 0.0
            result.trajectories[a] = Trajectory(
                episode_id=episode_id,
                session=episode_id,
                agent_id=a,
                role=self.roles[a],
                policy_version=self.policy_version(a),
                turns=[],
                metadata={"seed": seed} if task is None else {"seed": seed, "task": task},
            )
        return _Live(env, seed, episode_id, obs, infos, comms, result, metric_keys)

    def play(
        self, seeds: Sequence[int], max_turns: int | None = None, tasks: Sequence[str] | None = None
    ) -> list[EpisodeResult]:
        """Play one episode per seed, in lockstep, to the end.

        Args:
            seeds: Problem seed per episode (repeat a seed to get a GRPO group).
            max_turns: Safety cap on turns per episode (the env truncates on its own ``max_turns``).
            tasks: Optional task name per episode (same length as ``seeds``).

        Returns:
            One :class:`EpisodeResult` per seed, in order (the same objects ``on_episode_end`` received).

        Raises:
            ValueError: ``tasks`` and ``seeds`` differ in length.
            MartiError: A service or env error (the sessions opened are closed first).
        """
        if tasks is not None and len(tasks) != len(seeds):
            raise ValueError(f"{len(tasks)} tasks for {len(seeds)} seeds")
        lives: list[_Live] = []
        try:
            for i, s in enumerate(seeds):  # inside the try: a failed start still closes the sessions opened
                lives.append(self._start(s, None if tasks is None else tasks[i]))
            step = 0
            while any(not lv.done for lv in lives) and (max_turns is None or step < max_turns):
                self._turn(lives, step)
                step += 1
            self._finish_ended(lives, every=True)
            return [lv.result for lv in lives]
        finally:
            for lv in lives:
                for closable in (*lv.comms.values(), lv.env):
                    _close_quietly(closable)

    # ------------------------------------------------------------------------------------------ one turn
    def _inbox(self, lv: _Live, agent: str) -> list[tuple[str, str]]:
        """Messages for ``agent`` since its last turn: from the broker, or the local mailbox without one."""
        comm = lv.comms.get(agent)
        if comm is None:
            return lv.mailbox.pop(agent, [])
        out = []
        for m in comm.get_messages():
            body = m.content if hasattr(m, "content") else m
            if isinstance(body, dict):
                body = body.get("text", json.dumps(body))
            out.append((str(getattr(m, "sender", "?")), str(body)))
        lv.received += len(out)
        return out

    def _turn_prompt(self, lv: _Live, agent: str, step: int) -> tuple[list[dict[str, str]], str]:
        """The chat prompt of ``agent`` and its reply start: its system prompt (the role's template if the
        workflow gives one) and the user message of the role's ``build_prompt``
        (:meth:`marti.team.workflow.Role.turn_prompt`), and the reply start it gives (``""``: none).

        Raises:
            InvalidArgumentError: ``build_prompt`` returned neither a ``str`` nor a ``TurnPrompt`` (named).
        """
        role = self.workflow.role(agent)
        ctx = PromptContext(
            agent=agent,
            role=self.roles[agent],
            observation=str(lv.obs.get(agent, "")),
            messages=self._inbox(lv, agent),
            step=step,
            info=dict(lv.infos.get(agent, {}) or {}),
        )
        system = role_system_prompt(
            role, self.system_prompts[agent], self.roles[agent], self.capabilities.get(agent, "")
        )
        built = role.turn_prompt(ctx)
        chat = [{"role": "system", "content": system}, {"role": "user", "content": built.user}]
        return chat, built.reply_start

    def _turn(self, lives: list[_Live], step: int) -> None:
        """One turn of every live episode: the workflow's speakers reply (model agents generated in one batch
        per agent, scripted agents by their callable), replies are parsed into actions, the envs are stepped
        together, every reply is recorded and routed to the team, and the episodes that ended are finished."""
        wf = self.workflow
        model_items: dict[str, list[tuple[_Live, list[dict[str, str]], str]]] = {}
        texts: dict[int, dict[str, str]] = {id(lv): {} for lv in lives}
        gens: dict[int, dict[str, Any]] = {id(lv): {} for lv in lives}
        order: dict[int, list[str]] = {}
        live = [lv for lv in lives if not lv.done]
        for lv in live:
            agents = list(lv.env.agents)
            state = WorkflowState(
                step=step,
                agents=agents,
                env_acting=[a for a in agents if (lv.infos.get(a, {}) or {}).get("is_acting")],
                observations=dict(lv.obs),
                infos={a: dict(i or {}) for a, i in lv.infos.items()},
                transcript=list(lv.result.transcript),
                task=lv.result.task,
            )
            order[id(lv)] = wf.speakers(state)
            for agent in order[id(lv)]:
                chat, reply_start = self._turn_prompt(lv, agent, step)
                policy = wf.role(agent).policy
                if policy is not None:  # a script's answer continues the reply start, as a model's does
                    texts[id(lv)][agent] = reply_start + str(policy(chat))
                else:
                    model_items.setdefault(agent, []).append((lv, chat, reply_start))
        for agent, items in model_items.items():
            outs = self._generate(agent, items, step)
            for (lv, _, _), gen in zip(items, outs, strict=True):
                texts[id(lv)][agent] = gen.text
                gens[id(lv)][agent] = gen
        acts = []
        for lv in live:
            act = {a: "" for a in lv.env.agents}
            for agent in order[id(lv)]:
                act[agent] = wf.action(agent, texts[id(lv)][agent])
            acts.append(act)
        stepped = step_many([lv.env for lv in live], acts)
        for lv, (obs, rewards, terms, truncs, infos) in zip(live, stepped, strict=True):
            for agent in order[id(lv)]:  # in the workflow's order
                text = texts[id(lv)][agent]
                info = infos.get(agent, {}) or {}
                lv.parsed += 0 if info.get("parse_error") else 1
                lv.turns += 1
                lv.result.transcript.append((step, agent, text))
                gen = gens[id(lv)].get(agent)
                if gen is not None:
                    lv.result.trajectories[agent].turns.append(
                        Turn(
                            step=step,
                            prompt_token_ids=list(gen.prompt_token_ids),
                            response_token_ids=list(gen.response_token_ids),
                            response_logprobs=[float(x) for x in gen.response_logprobs],
                            reward=float(rewards.get(agent, 0.0)),
                            terminated=bool(terms.get(agent, False)),
                            truncated=bool(truncs.get(agent, False)),
                            info=_turn_info(info, gen),
                            policy_version=int(getattr(gen, "policy_version", 0)),
                            response_text=text,
                        )
                    )
                if lv.comms:
                    self._route(lv, agent, text, step)
                elif self.local_mailbox:
                    for receiver in self.agents:
                        if receiver != agent:
                            lv.mailbox.setdefault(receiver, []).append((agent, text))
            for a, r in rewards.items():
                lv.result.returns[a] = lv.result.returns.get(a, 0.0) + float(r)
            lv.obs, lv.infos = obs, infos
            if not lv.env.agents or all(terms.get(a) or truncs.get(a) for a in terms):
                lv.done = True
        self._finish_ended(lives)

    def _generate(
        self, agent: str, items: list[tuple[_Live, list[dict[str, str]], str]], step: int
    ) -> list[Any]:
        """The agent's replies to its prompts ``items`` (episode, chat, reply start): ``generate`` gets the reply
        starts only when one is not empty (:data:`GenerateFn`). A prompt the engine refuses as too long (its
        position in the call, :func:`~services.trainer.rollout.engines.base.too_long_prompt`) is named by its
        episode's problem (:attr:`describe_seed`), the agent, the turn and, when it has one, its reply start.

        Raises:
            InvalidArgumentError: A too-long prompt (named as above), or what ``generate`` raises.
        """
        chats = [c for _, c, _ in items]
        starts = [s for _, _, s in items]
        try:
            return self.generate(agent, chats, starts) if any(starts) else self.generate(agent, chats)
        except InvalidArgumentError as exc:
            i = too_long_prompt(exc)
            if i is None or not 0 <= i < len(items):
                raise
            lv = items[i][0]
            with_start = f" (with its reply start {starts[i][:60]!r})" if starts[i] else ""
            raise InvalidArgumentError(
                f"{self.describe_seed(lv.seed)}, agent {agent!r}, turn {step} (episode {lv.episode_id}): "
                f"its prompt{with_start} is too long: {shifted(exc, 0)}"
            ) from None

    def _route(self, lv: _Live, sender: str, text: str, step: int) -> None:
        comm = lv.comms.get(sender)
        if comm is None:
            return
        for receiver in self.agents:
            if receiver != sender:
                comm.send_message(receiver, {"text": text, "turn": step, "role": self.roles[sender]})
        comm.broadcast_state({"turn": step, "role": self.roles[sender], "last_action": text[:200]})
        comm.flush()

    # ------------------------------------------------------------------------------------------ the end
    def _finish_ended(self, lives: list[_Live], every: bool = False) -> None:
        """Finish the episodes that ended (``every``: all the others too), re-score them together with
        ``rescore``, and hand each to ``on_episode_end``.

        Raises:
            InvalidArgumentError: An agent's credited return is not finite or is beyond +-1e20
                (:func:`marti.rewards.base.check_reward`; an env's rewards of -1e308 sum to -inf), named with its
                episode's problem (:attr:`describe_seed`), before any hook sees or logs it.
        """
        ended = [lv for lv in lives if not lv.finished and (lv.done or every)]
        views = [self._finish(lv) for lv in ended]
        if ended and self.rescore is not None:
            for lv, view, base in zip(ended, views, self.rescore(views), strict=True):
                lv.result.returns = self.workflow.rewards(dataclasses.replace(view, env_returns=dict(base)))
                lv.result.metrics.update(view.metrics)  # metrics the hook added (judge/unreadable)
        for lv in ended:
            for agent, ret in lv.result.returns.items():  # an env's rewards can sum past any float
                check_reward(
                    ret,
                    f"{self.describe_seed(lv.seed)}, agent {agent!r} (episode {lv.episode_id}), its return",
                )
            lv.finished = True
            if self.records is not None:
                _complete(lv.result, self.records)
            else:
                lv.result.trajectories = {a: t for a, t in lv.result.trajectories.items() if t.turns}
            if self.on_episode_end is not None:
                self.on_episode_end(lv.result)

    def _finish(self, lv: _Live) -> EpisodeView:
        last = (next(iter(lv.infos.values()), {}) if lv.infos else {}) or {}
        for key in lv.metric_keys:
            if key in last:
                try:
                    lv.result.metrics[key] = float(last[key])
                except (TypeError, ValueError):
                    _LOG.warning("env metric %r is not a number (%r); not reported", key, last[key])
        if isinstance(last.get("team_answer"), str):
            lv.result.team_answer = last["team_answer"]
        lv.result.metrics["num_turns"] = float(lv.turns)
        lv.result.metrics["format_valid"] = lv.parsed / lv.turns if lv.turns else 0.0
        lv.result.metrics["messages"] = float(lv.received)
        lv.result.env_returns = dict(lv.result.returns)
        view = EpisodeView(
            agents=list(self.agents),
            transcript=list(lv.result.transcript),
            env_returns=dict(lv.result.returns),
            metrics=dict(lv.result.metrics),
            final_infos={a: dict(i or {}) for a, i in (lv.infos or {}).items()},
            seed=lv.seed,
            task=lv.result.task,
        )
        lv.result.returns = self.workflow.rewards(view)
        return view
