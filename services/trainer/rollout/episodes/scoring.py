"""Rewards of dataset episodes from the ``reward:`` section's scorers (docs/datasets.md): user reward functions,
a remote reward server and a reward model (on its own Ray actor), summed.

For each finished episode the team's reply and every agent's own last reply are scored against the problem's
prompt and columns, in one batch per call of :meth:`EpisodeScorer.rescore` (the episodes that ended in the same
turn); agents are credited by :func:`marti.rewards.team.credit` (``environment.options.own_weight``), and those
credits replace the env's verifier returns before the workflow's allocation. Replies are scored as generated
(before a workflow's parser). A team with no reply scores 0 for the team part; a scorer's error (a raising
function, NaN, a wrong length, a server that times out) stops the job with the scorer named.

With ``reward.judge_agent`` (an LLM judge: a frozen agent that speaks last) the verdict read from the judge's last
reply (:func:`marti.rewards.judge.read_verdict`) is the score of the team's answer, the reply before the judge
spoke, and every agent is credited it. A verdict that cannot be read (or a judge that did not speak) scores 0.0,
is logged as a warning naming the problem seed and the reply, and sets the episode metric ``judge/unreadable`` to
1 (0 otherwise; the step's log shows the fraction of unreadable verdicts).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from marti.config import TrainConfig
from marti.errors import (
    DeadlineExceededError,
    FailedPreconditionError,
    InvalidArgumentError,
    UnavailableError,
    in_context,
)
from marti.rewards import (
    RewardFunction,
    RewardScorer,
    WeightedSum,
    check_batch,
    check_scores,
    reward_functions,
)
from marti.rewards.judge import compile_judge_pattern, read_verdict
from marti.rewards.team import OWN_WEIGHT, credit, last_replies, team_reply
from marti.team.workflow import EpisodeView
from services.trainer.data.tasks import DatasetTasks

_LOG = logging.getLogger(__name__)

#: ``score(prompts, completions, columns) -> list[float]`` on the reward-model actor (RayRuntime.score_rewards).
ScoreFn = Callable[[list[str], list[str], dict[str, list[Any]]], list[float]]


class ActorScorer:
    """A :class:`~marti.rewards.RewardScorer` whose scores come from the reward-model actor.

    Args:
        score: The runtime's ``score_rewards``.
        path: The reward model (for error messages).
    """

    def __init__(self, score: ScoreFn, path: str) -> None:
        self._score = score
        self.name = f"reward model {path!r}"

    def score(
        self, prompts: Sequence[str], completions: Sequence[str], columns: Mapping[str, Sequence[Any]]
    ) -> list[float]:
        """Score on the actor; the answer is checked like any scorer's (length, finite numbers)."""
        n = check_batch(prompts, completions, columns, scorer=self.name)
        got = self._score(list(prompts), list(completions), {k: list(v) for k, v in columns.items()})
        return check_scores(got, n, scorer=self.name)


def build_scorer(cfg: TrainConfig, score_model: ScoreFn | None) -> RewardScorer | None:
    """The ``reward`` section's scorers summed, or None when it has none.

    Args:
        cfg: The training config.
        score_model: The reward-model actor's scoring call; None leaves ``reward.model`` out (the trainer
            builds the rest once before the job starts, so a reward function that does not load fails early).

    Raises:
        NotFoundError / InvalidArgumentError: A reward function that does not load, a bad remote URL (each
            prefixed by its key: ``reward.functions``, ``reward.remote_url (--remote_rm_url)``).
    """
    r = cfg.reward
    scorers: list[RewardScorer] = []
    if r.functions:
        with in_context("reward.functions"):
            scorers.append(reward_functions(r.functions, r.function_weights))
    if r.remote_url:
        from marti.rewards.remote import RemoteRewardScorer

        label_key = cfg.dataset.label_key if cfg.dataset is not None else None
        with in_context("reward.remote_url (--remote_rm_url)"):
            remote = RemoteRewardScorer(
                r.remote_url,
                timeout_s=r.remote_timeout_s,
                retries=r.remote_retries,
                backoff_s=r.remote_backoff_s,
                batch_size=r.remote_batch_size,
                label_key=label_key,
            )
        scorers.append(remote)
    if r.model and score_model is not None:
        scorers.append(ActorScorer(score_model, r.model))
    if not scorers:
        return None
    return scorers[0] if len(scorers) == 1 else WeightedSum(scorers)


#: Training rows :func:`check_reward_calls` scores in its one call: two, so that a scorer returning a fixed number
#: of scores (``return [score]``) is refused there too; a scoring call is never of one completion (the team's
#: reply and each agent's own).
CHECK_ROWS = 2


def check_reward_calls(scorer: RewardScorer | None, tasks: DatasetTasks) -> None:
    """Call each reward function of ``scorer`` (:func:`build_scorer`'s, every ``reward.functions`` entry) and its
    remote reward server (``reward.remote_url``; not a reward model, whose actor is not started yet) once, as
    :class:`EpisodeScorer` calls them: on the first :data:`CHECK_ROWS` training rows, their ``input_key`` texts as
    the prompts and every column by name, with one placeholder completion each, the row's label as text (``""``
    without a ``label_key``). ``marti train`` runs it before the run folder, so a function that raises, takes
    other keywords than the columns it is given (``def f(prompts, completions)``, or a ``label`` parameter on a
    job whose label column is ``answer``) or returns no finite score or another number of scores than
    completions, and a server that is down, too slow, answers an error or no ``{"rewards": [...]}`` (after its ``remote_retries``), are refused before an ``--overwrite`` deletes the
    previous run and before any service or model starts, not at the first scoring.

    Raises:
        InvalidArgumentError / MartiError: What :meth:`marti.rewards.RewardFunction.score` and
            :meth:`marti.rewards.remote.RemoteRewardScorer.score` raise (the function or URL, the exception or
            answer named; a server's ``UnavailableError`` / ``DeadlineExceededError`` keep their class),
            prefixed by the key (``reward.functions``, ``reward.remote_url (--remote_rm_url)``) and the rows.
    """
    parts = _called_before_the_run(scorer)
    if not parts:
        return
    train = tasks.problems.train
    seeds = range(min(CHECK_ROWS, len(train)))
    rows = [train.row(i) for i in seeds]
    label_key = tasks.section.label_key
    completions = [str(row[label_key]) if label_key is not None else "" for row in rows]
    prompts = [str(row[tasks.section.input_key]) for row in rows]
    named = " and ".join(train.where(i) for i in seeds)
    where = (
        f"called once before the run on {named} of dataset {train.source} "
        f"with {completions!r} as the completions"
    )
    for key, part in parts:
        with in_context(f"{key}, {where}"):
            part.score(prompts, completions, _columns(rows))


def _called_before_the_run(scorer: RewardScorer | None) -> list[tuple[str, RewardScorer]]:
    """The parts of ``scorer`` :func:`check_reward_calls` calls, each with its config key, in order (inside
    weighted sums): every :class:`~marti.rewards.RewardFunction` and the remote reward server."""
    if isinstance(scorer, RewardFunction):
        return [("reward.functions", scorer)]
    if isinstance(scorer, WeightedSum):
        return [pair for part in scorer.scorers for pair in _called_before_the_run(part)]
    remote = sys.modules.get(
        "marti.rewards.remote"
    )  # a RemoteRewardScorer was built only if it is loaded (httpx)
    if remote is not None and isinstance(scorer, remote.RemoteRewardScorer):
        return [("reward.remote_url (--remote_rm_url)", scorer)]
    return []


def _columns(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Column name -> one value per row (the first row's columns): the ``columns`` of a scoring call."""
    return {k: [r.get(k) for r in rows] for k in (rows[0] if rows else {})}


class EpisodeScorer:
    """The runner's ``rescore`` hook of a dataset job with reward scorers (see the module docstring).

    Args:
        cfg: The training config (``environment.options``: ``final``, ``final_agent``, ``own_weight``,
            ``verifier``).
        tasks: The job's problems (rows by seed).
        scorer: The summed scorers (:func:`build_scorer`); None with ``reward.judge_agent`` (the judge scores).

    Raises:
        InvalidArgumentError: Neither a scorer nor a judge.
    """

    def __init__(self, cfg: TrainConfig, tasks: DatasetTasks, scorer: RewardScorer | None) -> None:
        opts = cfg.environment.options
        self.tasks, self.scorer = tasks, scorer
        self.judge = cfg.reward.judge_agent
        self.judge_pattern = compile_judge_pattern(cfg.reward.judge_pattern)
        self.judge_timeout_s = cfg.reward.judge_pattern_timeout_s
        if scorer is None and self.judge is None:
            raise InvalidArgumentError("EpisodeScorer needs a reward scorer or reward.judge_agent")
        self.input_key = tasks.section.input_key
        self.final = opts.get("final", "agent")
        self.final_agent = opts.get("final_agent")
        self.own_weight = float(opts.get("own_weight", OWN_WEIGHT))
        self.verifier = opts.get("verifier", "exact")
        self.pattern = opts.get("pattern")
        self.regex_timeout_s = opts.get("regex_timeout_s")

    def rescore(self, views: Sequence[EpisodeView]) -> list[dict[str, float]]:
        """Each episode's per-agent credit from the scorers (one scoring call for all of ``views``), or from the
        judge's verdicts (each view's ``metrics`` gets ``judge/unreadable``)."""
        if self.judge is not None:
            return [self._judged(view) for view in views]
        prompts: list[str] = []
        completions: list[str] = []
        rows: list[dict[str, Any]] = []
        plan: list[tuple[bool, list[str]]] = []  # per episode: has a team reply, the agents that replied
        for view in views:
            row = self.tasks.row(view.seed)
            last, team = self._replies(view)
            texts = ([team] if team is not None else []) + list(last.values())
            prompts += [str(row[self.input_key])] * len(texts)
            completions += texts
            rows += [row] * len(texts)
            plan.append((team is not None, list(last)))
        columns = _columns(rows)
        scores = iter(self._score(prompts, completions, columns) if completions else [])
        out = []
        for view, (has_team, replied) in zip(views, plan, strict=True):
            team = next(scores) if has_team else 0.0
            own = {a: next(scores) for a in replied}
            out.append(credit(team, own, view.agents, self.own_weight))
        return out

    def _judged(self, view: EpisodeView) -> dict[str, float]:
        """Every agent credited the judge's verdict on the team's answer (0.0 when it cannot be read)."""
        said = [text for _, agent, text in view.transcript if agent == self.judge and text]
        why = f"no verdict readable with reward.judge_pattern {self.judge_pattern.pattern!r}"
        try:
            verdict = read_verdict(said[-1], self.judge_pattern, self.judge_timeout_s) if said else None
        except DeadlineExceededError as exc:  # a pattern that backtracks catastrophically: unreadable, said
            verdict, why = None, str(exc)
        view.metrics["judge/unreadable"] = float(verdict is None)
        if verdict is None:
            reply = repr(said[-1][:200]) if said else "nothing (the judge did not speak)"
            _LOG.warning(
                "judge %r: %s in problem seed %d; scored 0.0. Its reply: %s",
                self.judge,
                why,
                view.seed,
                reply,
            )
        return credit(verdict or 0.0, {}, view.agents, self.own_weight)

    def _score(
        self, prompts: list[str], completions: list[str], columns: dict[str, list[Any]]
    ) -> list[float]:
        """The scorers' scores. A scorer that stays unreachable or slow after its own retries (a remote reward
        server that is down) stops the job as :class:`~marti.errors.FailedPreconditionError`: it is not one of the
        job's services, so the loop's reconnect (which replays a rollout while a service restarts) must not
        replay the step for it."""
        try:
            return self.scorer.score(prompts, completions, columns)
        except (UnavailableError, DeadlineExceededError) as exc:
            raise FailedPreconditionError(f"reward scoring failed: {exc}") from exc

    def _replies(self, view: EpisodeView) -> tuple[dict[str, str], str | None]:
        """Agent -> its last reply, and the team's reply (None when there is none)."""
        steps: dict[int, dict[str, str]] = {}
        for step, agent, text in view.transcript:
            steps.setdefault(step, {})[agent] = text
        last, speaker = last_replies([steps[s] for s in sorted(steps)], view.agents)
        team = team_reply(
            last,
            view.agents,
            final=self.final,
            final_agent=self.final_agent,
            last_speaker=speaker,
            verifier=self.verifier,
            pattern=self.pattern,
            regex_timeout_s=self.regex_timeout_s,
        )
        return last, team
