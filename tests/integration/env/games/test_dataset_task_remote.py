"""``dataset_task`` on a real env server process: Unicode rows arrive unchanged, math-verify scores answers called from
the server's worker threads, and a bad row is refused naming its column."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from faults import procs

import marti
from marti.errors import InvalidArgumentError

PROBLEM = "设 $f(x) = \\frac{x^2 - 1}{x - 1}$，求 $\\lim_{x \\to 1} f(x)$。Réponse en LaTeX ✓"
ROW = {"prompt": PROBLEM, "label": "2", "提示": "分解因式：$x^2 - 1 = (x-1)(x+1)$"}
CONFIG = {
    "row": ROW,
    "agents": ["求解者", "judge"],
    "agent_inputs": {"judge": "提示"},
    "verifier": "math",
    "max_turns": 2,
}
TURNS = (
    {"求解者": "因为 $f(x) = x + 1$，所以极限是 $\\boxed{2}$。", "judge": ""},
    {"judge": "答案：$\\frac{4}{2}$"},
)


@pytest.fixture(scope="module")
def env_server() -> Iterator[str]:
    """A real ``marti env-server`` process on a free port; yields its address."""
    service = procs.start("env-server")
    try:
        yield service.address
    finally:
        service.signal()
        try:
            service.proc.wait(timeout=15)
        finally:
            service.stop()


def _play(**where: Any) -> list[Any]:
    env = marti.make("dataset_task", **where, **CONFIG)
    try:
        seen: list[Any] = [env.reset(seed=0)]
        seen += [env.step(actions) for actions in TURNS]
        return seen
    finally:
        env.close()


@pytest.mark.parametrize("transport", ["stream", "unary"])
def test_latex_and_chinese_problem_arrives_byte_identical_and_is_scored_remotely(
    env_server: str, transport: str
) -> None:
    remote = _play(address=env_server, transport=transport)
    (obs, infos) = remote[0]
    assert obs["求解者"].encode("utf-8") == PROBLEM.encode("utf-8")
    assert obs["judge"].encode("utf-8") == ROW["提示"].encode("utf-8")
    _, rewards, terms, _, infos = remote[-1]
    # \boxed{2} and \frac{4}{2}, scored by math-verify called from the server's gRPC worker threads
    assert rewards == {"求解者": 1.0, "judge": 1.0}
    assert terms == {"求解者": True, "judge": True}
    assert infos["judge"]["answer"] == "\\frac{4}{2}" and infos["judge"]["task_completion"] == 1.0
    assert remote == _play()  # the same episode in-process


def test_a_row_without_its_input_column_is_refused_by_the_server(env_server: str) -> None:
    with pytest.raises(InvalidArgumentError, match="row has no input column 'question'"):
        marti.make("dataset_task", address=env_server, row=ROW, input_key="question")
