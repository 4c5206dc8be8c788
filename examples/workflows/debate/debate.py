"""Debate with an aggregator (user code for debate.yaml).

Two model solvers and one scripted solver (:func:`calculator`, a Python function, never trained) answer for
``rounds`` rounds, each seeing the others' last answers; then the aggregator answers for the team.

* :func:`calculator` solves ``What is a op b [op c]?`` questions exactly and otherwise repeats the most common
  answer it has heard (scripted agent: ``policy(chat) -> str``);
* :func:`answer_line` makes any reply end in ``answer: <integer>`` (the last integer in it);
* :func:`aggregator_prompt` lists the solvers' latest answers with a vote count;
* :func:`majority_bonus` rewards solvers whose last answer matched the aggregator's final answer.
"""

from __future__ import annotations

import re
from collections import Counter

from marti.team.workflow import EpisodeView, PromptContext

_INT_RE = re.compile(r"-?\d+")
_EXPR_RE = re.compile(r"What is (-?\d+) ([-+*]) (-?\d+)(?: ([-+]) (-?\d+))?\?")


def _apply(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def calculator(chat: list[dict[str, str]]) -> str:
    """Scripted solver: exact arithmetic for ``What is ...?`` problems (``*`` before ``+``/``-``), else the most
    common integer among the teammates' messages (0 when there is none)."""
    user = chat[-1]["content"]
    m = _EXPR_RE.search(user)
    if m:
        a, op1, b, op2, c = m.groups()
        value = _apply(int(a), op1, int(b))
        if op2:
            value = _apply(value, op2, int(c))
        return f"I computed it. answer: {value}"
    heard = [int(x) for line in user.splitlines() if line.startswith("[") for x in _INT_RE.findall(line)[-1:]]
    guess = Counter(heard).most_common(1)[0][0] if heard else 0
    return f"Going with the majority. answer: {guess}"


def answer_line(text: str) -> str:
    """The reply with a last line ``answer: N`` (N = the last integer in the text); unchanged if none."""
    ints = _INT_RE.findall(text)
    return f"{text}\nanswer: {ints[-1]}" if ints else text


def aggregator_prompt(ctx: PromptContext) -> str:
    """Observation, then each solver's latest answer and the votes per answer."""
    latest: dict[str, str] = {}
    for sender, text in ctx.messages:
        ints = _INT_RE.findall(text)
        if ints:
            latest[sender] = ints[-1]
    votes = Counter(latest.values())
    lines = [f"{s} answered {v}" for s, v in latest.items()]
    tally = ", ".join(f"{v}: {n} vote(s)" for v, n in votes.most_common())
    return f"{ctx.observation}\n" + "\n".join(lines) + (f"\nVotes: {tally}" if tally else "")


def majority_bonus(episode: EpisodeView) -> dict[str, float]:
    """0.5 to each solver whose last answer equals the aggregator's final answer; the aggregator gets 0."""
    final = {agent: text for _, agent, text in episode.transcript}
    agg = next((a for a, i in episode.final_infos.items() if i.get("role") == "aggregator"), None)
    target = _INT_RE.findall(final.get(agg, "")) if agg else []
    out = dict.fromkeys(episode.agents, 0.0)
    for agent, text in final.items():
        ints = _INT_RE.findall(text)
        if agent != agg and target and ints and ints[-1] == target[-1]:
            out[agent] = 0.5
    return out
