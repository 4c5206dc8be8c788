"""Env calls run off the env server's event loop: one session sleeping in ``step`` does not stall the others.

A real env server (port 0) hosts a test-only env whose ``step`` sleeps when its action says ``sleep:<seconds>``,
or waits while the action ``"hold"`` is held (until a step with the action ``"open"``).
While one session's step is held, 10 other sessions step 20 times each through ``EnvClient``: every one of
those 200 calls is answered while it is still held (their p50 and p99 are printed; the p99 must stay under
1 s). On the old servicer (env calls on the loop) every one of those calls waits for the held step (up to
:data:`HOLD_S`). Also: a session's calls never overlap and keep their order, calls beyond ``step_workers`` queue
without error, and shutdown waits for an in-flight step.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import gymnasium
import pytest
from waits import until

from marti.clients.env import EnvClient
from marti.env.config import ConfigSchema
from marti.env.registry import EnvSpec, Registry
from marti.rpc.testing import ServerThread, serve_in_thread
from services.env_server.core.sessions import SessionManager
from services.env_server.servicer import env_service
from services.env_server.settings import EnvServerSettings

ENV = "sleepy-v1"
HOLD_S = 30.0  # most seconds a "hold" step waits for an "open" one


class SleepyEnv:
    """One-agent text env; ``step`` sleeps ``s`` seconds on the action ``"sleep:s"``, waits (at most
    :data:`HOLD_S`, then raises) on ``"hold"`` until some session steps ``"open"``, and observes its step count;
    its info holds the action (``echo``) and how many steps are held now (``holding``).

    Every instance logs ``(event, instance, step)`` into :attr:`log` and tracks how many of its own calls run at
    once (:attr:`max_overlap`), so a test can see order and overlap.
    """

    metadata = {"name": "sleepy"}
    missing_action = ""
    log: list[tuple[str, int, int]] = []
    started = threading.Event()
    gate = threading.Event()
    holding = 0
    _ids = iter(range(1, 1_000_000))
    _lock = threading.Lock()

    def __init__(self, config, seed) -> None:
        self.possible_agents = ["a"]
        self.agents: list[str] = []
        self.id = next(SleepyEnv._ids)
        self.t = 0
        self.running = 0
        self.max_overlap = 0
        self._space = gymnasium.spaces.Text(64, min_length=0)

    def observation_space(self, agent):
        return self._space

    def action_space(self, agent):
        return self._space

    def _enter(self, event: str) -> None:
        with SleepyEnv._lock:
            self.running += 1
            self.max_overlap = max(self.max_overlap, self.running)
            SleepyEnv.log.append((event, self.id, self.t))

    def _leave(self, event: str) -> None:
        with SleepyEnv._lock:
            self.running -= 1
            SleepyEnv.log.append((event, self.id, self.t))

    def reset(self, seed=None, options=None):
        self.agents, self.t = ["a"], 0
        return {"a": "0"}, {"a": {}}

    def step(self, actions):
        self._enter("step")
        try:
            action = actions.get("a", "")
            if action.startswith("sleep:"):
                SleepyEnv.started.set()
                time.sleep(float(action[6:]))
            elif action == "hold":
                self._hold()
            elif action == "open":
                SleepyEnv.gate.set()
            self.t += 1
            info = {"echo": action, "holding": SleepyEnv.holding}
            return {"a": str(self.t)}, {"a": 0.0}, {"a": False}, {"a": False}, {"a": info}
        finally:
            self._leave("step_end")

    def _hold(self) -> None:
        with SleepyEnv._lock:
            SleepyEnv.holding += 1
        try:
            if not SleepyEnv.gate.wait(HOLD_S):
                raise TimeoutError(f"held {HOLD_S} s: no step opened the gate")
        finally:
            with SleepyEnv._lock:
                SleepyEnv.holding -= 1

    def close(self):
        self._enter("close")
        self._leave("close_end")


def registry() -> Registry:
    reg = Registry()
    reg.register(EnvSpec("sleepy", 1, SleepyEnv, ConfigSchema(), "test env: step sleeps on 'sleep:<s>'"))
    return reg


def server_specs(workers: int):
    settings = EnvServerSettings(host="127.0.0.1", port=0, step_workers=workers, grace_s=5.0)
    sessions = SessionManager(registry(), workers=settings.step_workers)
    return settings, sessions, (lambda: [env_service(settings, sessions=sessions)])


_SERVE = """
import sys
sys.path[:0] = [{here!r}, {tests!r}]
from test_env_off_loop import registry
from marti.rpc.serving.server import run_server
from services.env_server.servicer import env_service
from services.env_server.settings import EnvServerSettings
settings = EnvServerSettings(host="127.0.0.1", port=0, step_workers=16, grace_s=1.0)
raise SystemExit(run_server([env_service(settings, registry=registry())], settings))
"""


@pytest.fixture
def server_process():
    """An env server in its own process (uvloop, its own GIL, as in production) hosting ``sleepy``; yields
    its address."""
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _SERVE.format(here=str(Path(__file__).resolve().parent), tests=str(root / "tests")),
        ],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.startswith("listening on "), f"env server did not start: {line!r}"
        yield line.split()[-1]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(autouse=True)
def _shut_gate():
    """A shut gate per test (for in-process servers), opened afterwards so that no worker stays held."""
    SleepyEnv.gate = threading.Event()
    yield
    SleepyEnv.gate.set()


@pytest.fixture
def server():
    settings, sessions, specs = server_specs(workers=16)
    with serve_in_thread(specs, settings) as running:
        yield running.address, sessions


def started_session(client: EnvClient) -> str:
    sid = client.create_session(ENV).session_id
    client.reset(sid)
    return sid


def in_thread(fn) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run() -> None:
        t0 = time.perf_counter()
        try:
            out["result"] = fn()
        except Exception as e:  # noqa: BLE001 - the test inspects it
            out["error"] = e
        out["elapsed_s"] = time.perf_counter() - t0
        out["end"] = time.perf_counter()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_one_held_session_does_not_stall_ten_others(server_process) -> None:
    """Each of the 200 calls is answered while the slow step is held (its info says so): a count, not a race
    with a sleep of fixed length."""
    with EnvClient(server_process, timeout_s=HOLD_S) as client:
        slow = started_session(client)
        others = [started_session(client) for _ in range(10)]
        slow_thread, slow_out = in_thread(lambda: client.step(slow, {"a": "hold"}))
        until(lambda: client.step(others[0], {"a": "go"}).infos["a"]["holding"] == 1, "the slow step held")
        latencies: list[float] = []  # of every call of the 10 sessions
        errors: list[BaseException] = []

        def step_20(sid: str) -> None:
            try:
                for _ in range(20):
                    t0 = time.perf_counter()
                    res = client.step(sid, {"a": "go"})
                    latencies.append(time.perf_counter() - t0)
                    assert res.infos["a"] == {"echo": "go", "holding": 1}, "answered after the held step"
            except BaseException as e:  # noqa: BLE001 - reported by the test thread
                errors.append(e)

        workers = [threading.Thread(target=step_20, args=(sid,), daemon=True) for sid in others]
        for w in workers:
            w.start()
        for w in workers:
            w.join(2 * HOLD_S)
        assert not errors, errors
        assert slow_thread.is_alive(), slow_out
        client.step(others[0], {"a": "open"})
        slow_thread.join(HOLD_S)
        assert "error" not in slow_out, slow_out.get("error")
        assert slow_out["result"].observations == {"a": "1"}
    latencies.sort()
    p99 = latencies[int(0.99 * (len(latencies) - 1))]
    print(
        f"\n{len(latencies)} calls during the held step: p50 {latencies[len(latencies) // 2] * 1e3:.2f} ms, "
        f"p99 {p99 * 1e3:.2f} ms, max {latencies[-1] * 1e3:.2f} ms"
    )
    assert len(latencies) == 200 and p99 < 1.0, f"p99 {p99 * 1e3:.1f} ms of the others while one env waits"


def test_a_sessions_calls_never_overlap_and_keep_their_order(server) -> None:
    address, sessions = server
    with EnvClient(address, timeout_s=30) as client:
        sid = started_session(client)
        env = sessions.get(sid).env.env
        # BatchStep: items of one session run in item order, the slow first one included
        res = client.batch_step([(sid, {"a": "sleep:0.3"}), (sid, {"a": "b"}), (sid, {"a": "c"})])
        assert [(r.observations["a"], r.infos["a"]["echo"]) for r in res] == [
            ("1", "sleep:0.3"),
            ("2", "b"),
            ("3", "c"),
        ]
        # the stream: a slow step, then a fast one, answered in order
        stream = client.stream()
        try:
            assert stream.step(sid, {"a": "sleep:0.2"}).observations == {"a": "4"}
            assert stream.step(sid, {"a": "x"}).observations == {"a": "5"}
        finally:
            stream.close()
        # concurrent unary calls on one session: one at a time, each sees the previous one's state
        runs = [in_thread(lambda: client.step(sid, {"a": "sleep:0.1"})) for _ in range(4)]
        for thread, _ in runs:
            thread.join(30)
        assert sorted(out["result"].observations["a"] for _, out in runs) == ["6", "7", "8", "9"]
        # a close sent while a step runs waits for it: the env is closed after the step ends
        SleepyEnv.started.clear()
        thread, out = in_thread(lambda: client.step(sid, {"a": "sleep:0.3"}))
        assert SleepyEnv.started.wait(10)
        time.sleep(0.05)
        assert client.close_session(sid) is True
        thread.join(30)
        assert out["result"].observations == {"a": "10"}
    assert env.max_overlap == 1
    mine = [e for e in SleepyEnv.log if e[1] == env.id]
    assert mine[-2:] == [("close", env.id, 10), ("close_end", env.id, 10)]


def test_calls_beyond_the_worker_limit_queue_without_error() -> None:
    settings, _, specs = server_specs(workers=2)  # the edge: both workers busy sleeping
    with serve_in_thread(specs, settings) as running, EnvClient(running.address, timeout_s=30) as client:
        a, b, c = (started_session(client) for _ in range(3))
        sleepers = [in_thread(lambda sid=sid: client.step(sid, {"a": "hold"})) for sid in (a, b)]
        until(lambda: SleepyEnv.holding == 2, "both workers held")
        third, third_out = in_thread(lambda: client.step(c, {"a": "queued"}))
        third.join(0.3)
        assert third.is_alive(), f"with 2 workers busy the call ran: not bounded ({third_out})"
        SleepyEnv.gate.set()
        third.join(HOLD_S)
        assert third_out["result"].infos["a"]["echo"] == "queued", (
            "the third call waited for a worker, no error"
        )
        for thread, out in sleepers:
            thread.join(30)
            assert out["result"].observations == {"a": "1"}


@pytest.mark.parametrize("grace_s", [5.0, 0.1])
def test_shutdown_waits_for_an_in_flight_step(grace_s) -> None:
    settings, sessions, specs = server_specs(workers=4)
    server_thread = ServerThread(specs, settings)
    running = server_thread.start()
    with EnvClient(running.address, timeout_s=30) as client:
        sid = started_session(client)
        env = sessions.get(sid).env.env
        SleepyEnv.started.clear()
        thread, out = in_thread(lambda: client.step(sid, {"a": "sleep:1"}))
        assert SleepyEnv.started.wait(10)
        server_thread.stop(grace_s=grace_s)
        thread.join(30)
    mine = [e[0] for e in SleepyEnv.log if e[1] == env.id]
    assert mine[-4:] == ["step", "step_end", "close", "close_end"], "the env was closed after its step ended"
    if grace_s > 1:
        assert out["result"].observations == {"a": "1"}, "a step inside the grace period completes"
    assert len(sessions) == 0


def test_a_stream_call_waits_at_most_timeout_s_then_the_stream_and_its_sessions_end():
    """A session stream's wait for its next response is bounded by the client's ``timeout_s`` (a bidi stream
    has no per-message deadline of its own): past it the call raises DeadlineExceededError naming the timeout,
    the stream is closed and its sessions are lost; the next call opens a new stream."""
    from marti.errors import DeadlineExceededError, NotFoundError

    settings, sessions, specs = server_specs(workers=4)
    with serve_in_thread(specs, settings) as server, EnvClient(server.address, timeout_s=2.0) as client:
        stream = client.stream()
        sid = stream.create_session(ENV).session_id
        stream.reset(sid)
        t0 = time.monotonic()
        with pytest.raises(
            DeadlineExceededError, match=r"within timeout_s=2.0 s; the session stream was closed"
        ):
            stream.step(sid, {"a": "hold"})
        assert 1.95 < time.monotonic() - t0 < HOLD_S / 2  # unbounded, it would wait for the held step
        SleepyEnv.gate.set()
        assert stream.broken
        with pytest.raises(NotFoundError):  # the session ended with its stream
            stream.reset(sid)
        fresh = stream.create_session(ENV).session_id  # a new stream serves new sessions
        stream.reset(fresh)
        assert stream.step(fresh, {"a": "quick"}).observations == {"a": "1"}
        for _ in range(200):  # answers well within the timeout never trip it
            stream.step(fresh, {"a": "quick"})
        stream.close()


def test_a_made_env_past_its_timeout_is_lost_and_its_reset_starts_a_new_session():
    import marti
    from marti.errors import SessionLostError

    settings, sessions, specs = server_specs(workers=4)
    with serve_in_thread(specs, settings) as server:
        env = marti.make(ENV, address=server.address, timeout_s=2.0)
        env.reset()
        first = env.session_id
        with pytest.raises(
            SessionLostError, match="DeadlineExceededError: the env server did not answer within"
        ):
            env.step({"a": "hold"})
        SleepyEnv.gate.set()
        assert env.session_lost
        obs, _ = env.reset()
        assert obs == {"a": "0"} and env.session_id != first and not env.session_lost
        assert env.step({"a": "quick"})[0] == {"a": "1"}
        env.close()


def test_an_answer_at_the_deadline_never_leaves_a_cancelled_stream_behind_a_success():
    """Answers that arrive right at ``timeout_s`` (0.5 s: the calls around them must succeed on a loaded
    machine): each call either fails with DeadlineExceededError (and the stream is replaced) or succeeds, and
    after a success the stream and its session keep working."""
    from marti.errors import DeadlineExceededError

    settings, sessions, specs = server_specs(workers=4)
    outcomes = {"late": 0, "ok": 0}
    with serve_in_thread(specs, settings) as server, EnvClient(server.address, timeout_s=0.5) as client:
        stream = client.stream()
        sid = stream.create_session(ENV).session_id
        stream.reset(sid)
        for i in range(12):
            try:
                stream.step(sid, {"a": f"sleep:{0.496 + 0.001 * (i % 6)}"})
            except DeadlineExceededError:
                outcomes["late"] += 1
                sid = stream.create_session(ENV).session_id  # the old one ended with its stream
                stream.reset(sid)
                continue
            outcomes["ok"] += 1
            time.sleep(0.03)  # a late cancel would land here
            assert not stream.broken, outcomes
            stream.step(sid, {"a": "quick"})
        stream.close()
    assert sum(outcomes.values()) == 12


def test_a_closed_env_refuses_reset_and_step_on_both_transports():
    import marti
    from marti.errors import FailedPreconditionError

    settings, sessions, specs = server_specs(workers=4)
    with serve_in_thread(specs, settings) as server:
        for transport in ("stream", "unary"):
            env = marti.make(ENV, address=server.address, transport=transport)
            env.reset()
            env.close()
            with pytest.raises(FailedPreconditionError, match="env is closed"):
                env.reset()
            with pytest.raises(FailedPreconditionError, match="env is closed"):
                env.step({"a": "quick"})
        assert len(sessions) == 0  # nothing was re-created behind the closed envs
