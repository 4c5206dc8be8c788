"""Env calls run off the env server's event loop: one session sleeping in ``step`` does not stall the others.

A real env server (port 0) hosts a test-only env whose ``step`` sleeps when its action says ``sleep:<seconds>``.
Measured: while one session sleeps 2 s in ``step``, 10 other sessions step through ``EnvClient``; the p99 of
their call latency must stay under 50 ms. On the old servicer (env calls on the loop) every one of those calls
waits for the sleep to end, so the p99 is about 2 s. Also: a session's calls never overlap and keep their
order, calls beyond ``step_workers`` queue without error, and shutdown waits for an in-flight step.
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

from marti.clients.env import EnvClient
from marti.env.config import ConfigSchema
from marti.env.registry import EnvSpec, Registry
from marti.rpc.testing import ServerThread, serve_in_thread
from services.env_server.core.sessions import SessionManager
from services.env_server.servicer import env_service
from services.env_server.settings import EnvServerSettings

ENV = "sleepy-v1"


class SleepyEnv:
    """One-agent text env; ``step`` sleeps ``s`` seconds on the action ``"sleep:s"`` and observes its step count.

    Every instance logs ``(event, instance, step)`` into :attr:`log` and tracks how many of its own calls run at
    once (:attr:`max_overlap`), so a test can see order and overlap.
    """

    metadata = {"name": "sleepy"}
    missing_action = ""
    log: list[tuple[str, int, int]] = []
    started = threading.Event()
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
            self.t += 1
            return {"a": str(self.t)}, {"a": 0.0}, {"a": False}, {"a": False}, {"a": {"echo": action}}
        finally:
            self._leave("step_end")

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
sys.path.insert(0, {here!r})
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
        [sys.executable, "-c", _SERVE.format(here=str(Path(__file__).resolve().parent))],
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


def test_one_sleeping_session_does_not_stall_ten_others(server_process) -> None:
    with EnvClient(server_process, timeout_s=30) as client:
        slow = started_session(client)
        others = [started_session(client) for _ in range(10)]
        slow_thread, slow_out = in_thread(lambda: client.step(slow, {"a": "sleep:2"}))
        time.sleep(0.1)  # the slow step is now sleeping in the server
        window_start = time.perf_counter()
        calls: list[tuple[float, float]] = []  # (start, latency) of every call of the 10 sessions
        errors: list[BaseException] = []

        def keep_stepping(sid: str) -> None:
            try:
                while slow_thread.is_alive():
                    t0 = time.perf_counter()
                    res = client.step(sid, {"a": "go"})
                    calls.append((t0, time.perf_counter() - t0))
                    assert res.infos["a"]["echo"] == "go"
                    time.sleep(0.005)
            except BaseException as e:  # noqa: BLE001 - reported by the test thread
                errors.append(e)

        workers = [threading.Thread(target=keep_stepping, args=(sid,), daemon=True) for sid in others]
        for w in workers:
            w.start()
        slow_thread.join(30)
        for w in workers:
            w.join(30)
        assert "error" not in slow_out, slow_out.get("error")
        assert slow_out["elapsed_s"] >= 2.0 and slow_out["end"] - window_start >= 1.5
        assert slow_out["result"].observations == {"a": "1"}
        assert not errors, errors
    # the calls that started while the slow step slept
    latencies = sorted(dt for t0, dt in calls if window_start <= t0 < slow_out["end"])
    p99 = latencies[int(0.99 * (len(latencies) - 1))]
    print(
        f"\n{len(latencies)} calls during the 2 s step: p50 {latencies[len(latencies) // 2] * 1e3:.2f} ms, "
        f"p99 {p99 * 1e3:.2f} ms, max {latencies[-1] * 1e3:.2f} ms"
    )
    assert p99 < 0.050, f"p99 {p99 * 1e3:.1f} ms of the other sessions while one env sleeps"
    assert len(latencies) >= 100, f"only {len(latencies)} calls ran during the sleep: they were stalled"


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
        sleepers = [in_thread(lambda sid=sid: client.step(sid, {"a": "sleep:0.6"})) for sid in (a, b)]
        time.sleep(0.2)  # both workers are now inside a sleep
        t0 = time.perf_counter()
        res = client.step(c, {"a": "queued"})
        waited = time.perf_counter() - t0
        assert res.infos["a"]["echo"] == "queued", "the third call waited for a worker, no error"
        assert waited >= 0.25, f"with 2 workers busy the call ran after {waited:.3f}s: not bounded"
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
    with serve_in_thread(specs, settings) as server, EnvClient(server.address, timeout_s=0.5) as client:
        stream = client.stream()
        sid = stream.create_session(ENV).session_id
        stream.reset(sid)
        t0 = time.monotonic()
        with pytest.raises(
            DeadlineExceededError, match=r"within timeout_s=0.5 s; the session stream was closed"
        ):
            stream.step(sid, {"a": "sleep:3"})
        assert 0.45 < time.monotonic() - t0 < 2.0
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
        env = marti.make(ENV, address=server.address, timeout_s=0.5)
        env.reset()
        first = env.session_id
        with pytest.raises(
            SessionLostError, match="DeadlineExceededError: the env server did not answer within"
        ):
            env.step({"a": "sleep:3"})
        assert env.session_lost
        obs, _ = env.reset()
        assert obs == {"a": "0"} and env.session_id != first and not env.session_lost
        assert env.step({"a": "quick"})[0] == {"a": "1"}
        env.close()


def test_an_answer_at_the_deadline_never_leaves_a_cancelled_stream_behind_a_success():
    """Answers that arrive right at ``timeout_s``: each call either fails with DeadlineExceededError (and the
    stream is replaced) or succeeds, and after a success the stream and its session keep working."""
    from marti.errors import DeadlineExceededError

    settings, sessions, specs = server_specs(workers=4)
    outcomes = {"late": 0, "ok": 0}
    with serve_in_thread(specs, settings) as server, EnvClient(server.address, timeout_s=0.1) as client:
        stream = client.stream()
        sid = stream.create_session(ENV).session_id
        stream.reset(sid)
        for i in range(30):
            try:
                stream.step(sid, {"a": f"sleep:{0.096 + 0.001 * (i % 6)}"})
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
    assert sum(outcomes.values()) == 30


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
