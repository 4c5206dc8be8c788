"""A team's answer to one problem and each agent's credit: shared by the ``dataset_task`` env (verifier rewards)
and the trainer's reward scorers (reward functions, remote servers, reward models), so both pick the same team
answer and credit agents by the same rule.

* The team's answer is ``final_agent``'s last reply (default: the last agent that spoke; agents that speak in the
  same step count in team order), or with ``final="majority"`` the reply whose extracted answer
  (:func:`answer_of`, normalised) is most common among the agents' last replies (ties: the earliest agent in team
  order).
* Agent ``a`` is credited ``(1 - own_weight) * team + own_weight * own_a`` when it replied, else ``team``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from marti.rewards.answers import extract_answer, last_number, normalize_text
from marti.rewards.math_worker import REGEX_TIMEOUT_S, last_match_in_worker

#: Default weight of an agent's own answer in its reward (the rest is the team's answer).
OWN_WEIGHT = 0.5

__all__ = ["OWN_WEIGHT", "answer_of", "credit", "last_replies", "team_reply"]


def answer_of(
    text: str, verifier: str, pattern: str | None = None, regex_timeout_s: float | None = None
) -> str | None:
    """The answer in a reply, as a majority vote and the ``team_answer`` info compare it, or None when it has none.

    ``regex``: the last match of ``pattern`` (group 1 if it has groups), the text the verifier compares, found
    in a worker process within ``regex_timeout_s`` seconds (None: the ``regex`` verifier's default,
    :data:`~marti.rewards.math_worker.REGEX_TIMEOUT_S`; no answer past it);
    otherwise :func:`~marti.rewards.answers.extract_answer` (a ``\\boxed{}``, an ``Answer:`` line), else for
    ``numeric`` the last number and for ``exact`` the whole reply (what each verifier reads).
    """
    if verifier == "regex" and pattern:
        timeout_s = REGEX_TIMEOUT_S if regex_timeout_s is None else regex_timeout_s
        return last_match_in_worker(pattern, text, timeout_s)
    answer = extract_answer(text)
    if answer is None and verifier == "numeric":
        answer = last_number(text)
    if answer is None and verifier == "exact" and text.strip():
        answer = text
    return answer


def last_replies(
    steps: Iterable[Mapping[str, str]], agents: Sequence[str]
) -> tuple[dict[str, str], str | None]:
    """Each agent's last non-empty reply, and the last agent that spoke.

    Args:
        steps: Per step, agent -> reply (``""`` or absent: did not speak), in step order.
        agents: The team, in order (speakers of one step count in this order).

    Returns:
        ``(agent -> last reply, last speaker or None)``.
    """
    last: dict[str, str] = {}
    speaker = None
    for step in steps:
        for agent in agents:
            text = step.get(agent, "")
            if text:
                last[agent], speaker = text, agent
    return last, speaker


def team_reply(
    last: Mapping[str, str],
    agents: Sequence[str],
    *,
    final: str = "agent",
    final_agent: str | None = None,
    last_speaker: str | None = None,
    verifier: str = "exact",
    pattern: str | None = None,
    regex_timeout_s: float | None = None,
) -> str | None:
    """The reply that is the team's answer (see the module docstring), or None when there is none.

    Args:
        last: Agent -> its last reply.
        agents: The team, in order.
        final: ``"agent"`` (``final_agent``'s reply) or ``"majority"``.
        final_agent: Whose reply is the team's; None: ``last_speaker``.
        last_speaker: The last agent that spoke.
        verifier: The verifier kind, for :func:`answer_of` (majority vote).
        pattern: The ``regex`` verifier's pattern, for :func:`answer_of`.
        regex_timeout_s: Seconds a ``regex`` match may take per reply, for :func:`answer_of` (None: its default).
    """
    if final == "agent":
        who = final_agent or last_speaker
        return last.get(who) if who else None
    votes: dict[str, str] = {}
    counts: Counter[str] = Counter()
    for agent in agents:
        answer = answer_of(last.get(agent, ""), verifier, pattern, regex_timeout_s)
        if answer is not None:
            key = normalize_text(answer)
            votes.setdefault(key, last[agent])
            counts[key] += 1
    if not counts:
        return None
    best = max(counts.values())
    return next(votes[k] for k in votes if counts[k] == best)


def credit(
    team: float, own: Mapping[str, float], agents: Sequence[str], own_weight: float = OWN_WEIGHT
) -> dict[str, float]:
    """Each agent's reward: ``(1 - own_weight) * team + own_weight * own[a]`` for agents in ``own`` (they
    replied), ``team`` for the others.

    Args:
        team: The team answer's score.
        own: Agent -> the score of its own last reply (agents that replied).
        agents: The team.
        own_weight: Weight of an agent's own score, in [0, 1].
    """
    return {
        a: (1 - own_weight) * float(team) + own_weight * float(own[a]) if a in own else float(team)
        for a in agents
    }
