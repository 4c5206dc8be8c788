"""Session core: fresh env per session, cap, idle reaping, idempotent request ids, and bad input survival."""

from __future__ import annotations

import pytest

from marti.env.registry import default_registry
from marti.errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
)
from services.env_server.core.session_state import Outcome
from services.env_server.core.sessions import SessionManager

ENV = "collaborative_task_solving"


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def manager(**kw) -> SessionManager:
    return SessionManager(default_registry(), **kw)


def test_each_session_gets_its_own_env() -> None:
    m = manager()
    a, b = m.create(ENV, seed=1), m.create(ENV, seed=1)
    assert a.env is not b.env and a.env.env is not b.env.env and a.env_id == f"{ENV}-v1"
    ra, rb = m.reset(a.session_id), m.reset(b.session_id)
    assert ra == rb  # same id, config and seed -> same start
    m.step(a.session_id, {"agent_1": "task_1: 1"})
    assert m.get(b.session_id).env.acting_agents == ["agent_1"]


def test_session_cap_edge() -> None:
    m = manager(max_sessions=2)
    first = m.create(ENV)
    m.create(ENV)
    with pytest.raises(ResourceExhaustedError, match="max_sessions=2"):
        m.create(ENV)
    m.close(first.session_id)
    m.create(ENV)
    assert len(m) == 2


def test_idle_sessions_are_reaped_at_the_timeout() -> None:
    clock = FakeClock()
    m = manager(idle_timeout_s=10.0, clock=clock)
    a, b = m.create(ENV), m.create(ENV)
    clock.t += 9.999
    m.reset(b.session_id)  # b used
    assert m.reap_idle() == []
    clock.t += 0.001
    assert m.reap_idle() == [a.session_id]
    with pytest.raises(NotFoundError, match=a.session_id):
        m.step(a.session_id, {})
    clock.t += 10.0
    assert m.reap_idle() == [b.session_id] and len(m) == 0


def test_owned_sessions_close_together() -> None:
    m = manager()
    m.create(ENV, owner="stream-1")
    m.create(ENV, owner="stream-1")
    keep = m.create(ENV, owner="stream-2")
    assert m.close_owned("stream-1") == 2 and m.session_ids() == [keep.session_id]
    assert m.close(keep.session_id) is True and m.close(keep.session_id) is False


def test_request_ids_make_retries_idempotent() -> None:
    m = manager(idempotency_window=2)
    s = m.create(ENV, seed=3, request_id="c1")
    assert m.create(ENV, seed=3, request_id="c1") is s and len(m) == 1
    m.reset(s.session_id, request_id="r1")
    first = m.step(s.session_id, {"agent_1": "task_1: 1"}, request_id="s1")
    again = m.step(s.session_id, {"agent_1": "task_1: 1"}, request_id="s1")
    assert again == first and s.env.env.turn == 1  # not stepped twice
    m.step(s.session_id, {"agent_2": "task_1: 1"}, request_id="s2")
    m.step(s.session_id, {"agent_3": "score: 1"}, request_id="s3")  # window 2: s1 forgotten
    assert m.step(s.session_id, {"agent_1": "x"}, request_id="s1") != first
    assert s.env.env.turn == 4


def test_only_the_newest_outcomes_are_held_and_an_older_retry_is_refused_not_reapplied() -> None:
    m = manager(idempotency_window=8)  # idempotency_results defaults to 1
    s = m.create(ENV, seed=3)
    m.reset(s.session_id, request_id="r1")
    first = m.step(s.session_id, {"agent_1": "task_1: 1"}, request_id="s1")
    second = m.step(s.session_id, {"agent_2": "task_1: 1"}, request_id="s2")
    assert m.step(s.session_id, {"agent_2": "task_1: 1"}, request_id="s2") == second  # the newest: replayed
    with pytest.raises(AlreadyExistsError, match=r"request_id 's1' .* already applied \(result 2\).*=1"):
        m.step(s.session_id, {"agent_1": "task_1: 1"}, request_id="s1")
    assert s.env.env.turn == 2 and first.result_id == 2
    assert [type(v).__name__ for v in s.results.values()] == ["int", "int", "Outcome"]

    two = manager(idempotency_window=8, idempotency_results=2)
    t = two.create(ENV, seed=3)
    two.reset(t.session_id, request_id="r1")
    first = two.step(t.session_id, {"agent_1": "task_1: 1"}, request_id="s1")
    two.step(t.session_id, {"agent_2": "task_1: 1"}, request_id="s2")
    assert two.step(t.session_id, {"agent_1": "task_1: 1"}, request_id="s1") == first and t.env.env.turn == 2
    with pytest.raises(AlreadyExistsError, match="'r1'"):
        two.reset(t.session_id, request_id="r1")
    assert sum(isinstance(v, Outcome) for v in t.results.values()) == 2


def test_bad_input_leaves_the_session_usable() -> None:
    m = manager()
    s = m.create(ENV, config={"max_action_chars": 100}, seed=0)
    with pytest.raises(FailedPreconditionError, match="reset"):
        m.step(s.session_id, {"agent_1": "x"})
    m.reset(s.session_id)
    cases = [
        ({"agent_9": "x"}, InvalidArgumentError, "unknown agent 'agent_9'"),
        ({"agent_1": "x" * 101}, InvalidArgumentError, "max_action_chars=100"),
        ({"agent_1": 5}, InvalidArgumentError, "must be text"),
        (["agent_1"], InvalidArgumentError, "dict"),
    ]
    for actions, exc, needle in cases:
        with pytest.raises(exc, match=needle):
            m.step(s.session_id, actions)
    assert s.env.env.turn == 0
    m.step(s.session_id, {"agent_1": "x" * 100})  # at the limit: accepted
    m.step(s.session_id, {"agent_2": "task_1: 0"})
    out = m.step(s.session_id, {"agent_3": "score: 1 accept"})
    assert all(r.terminated for r in out.results) and out.agents == ()
    with pytest.raises(FailedPreconditionError, match="episode is over"):
        m.step(s.session_id, {"agent_1": "x"})
    with pytest.raises(InvalidArgumentError, match="seed"):
        m.reset(s.session_id, seed="1")  # type: ignore[arg-type]
    assert m.reset(s.session_id).agents == ("agent_1", "agent_2", "agent_3")


def test_done_agent_and_missing_action_on_adapted_env() -> None:
    m = manager()
    s = m.create("pettingzoo", {"entry_point": "pettingzoo.classic.rps_v2:parallel_env", "max_turns": 2})
    m.reset(s.session_id, seed=0)
    with pytest.raises(InvalidArgumentError, match="missing action for agent"):
        m.step(s.session_id, {"player_0": 0})
    m.step(s.session_id, {"player_0": 0, "player_1": 1})
    m.step(s.session_id, {"player_0": 0, "player_1": 1})
    with pytest.raises(FailedPreconditionError):
        m.step(s.session_id, {"player_0": 0, "player_1": 1})


def test_unknown_env_id_and_bad_limits() -> None:
    m = manager()
    with pytest.raises(NotFoundError, match="'nope-v2'"):
        m.create("nope-v2")
    with pytest.raises(NotFoundError, match="collaborative_task_solving-v9"):
        m.create(f"{ENV}-v9")
    assert m.create(f"{ENV}-v1").env_id == f"{ENV}-v1"
    for kw in (
        {"max_sessions": 0},
        {"idle_timeout_s": 0},
        {"idempotency_window": 0},
        {"idempotency_results": 0},
        {"idempotency_window": 4, "idempotency_results": 5},
    ):
        with pytest.raises(InvalidArgumentError):
            manager(**kw)


class TwoSpeedEnv:
    """Tiny parallel env where agent 'fast' finishes after one step and 'slow' after three."""

    metadata = {"name": "two_speed"}
    missing_action = ""

    def __init__(self, config, seed) -> None:
        import gymnasium

        self.possible_agents = ["fast", "slow"]
        self.agents: list[str] = []
        self._space = gymnasium.spaces.Text(10, min_length=0)

    def observation_space(self, agent):
        return self._space

    def action_space(self, agent):
        return self._space

    def reset(self, seed=None, options=None):
        self.agents, self.t = list(self.possible_agents), 0
        return {a: "o" for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        live = list(self.agents)
        done = {a: (a == "fast" and self.t >= 1) or self.t >= 3 for a in live}
        self.agents = [a for a in live if not done[a]]
        return (
            {a: "o" for a in live},
            dict.fromkeys(live, 0.0),
            done,
            dict.fromkeys(live, False),
            {a: {} for a in live},
        )

    def close(self):
        pass


def test_action_for_done_agent_is_named() -> None:
    from marti.env.config import ConfigSchema
    from marti.env.registry import EnvSpec, Registry

    reg = Registry()
    reg.register(EnvSpec("two_speed", 1, TwoSpeedEnv, ConfigSchema(), "test env"))
    m = SessionManager(reg)
    s = m.create("two_speed")
    m.reset(s.session_id)
    m.step(s.session_id, {"fast": "a", "slow": "b"})
    with pytest.raises(InvalidArgumentError, match="agent 'fast' is done"):
        m.step(s.session_id, {"fast": "a", "slow": "b"})
    out = m.step(s.session_id, {"slow": "b"})  # the session survived
    assert [r.agent for r in out.results] == ["slow"]
