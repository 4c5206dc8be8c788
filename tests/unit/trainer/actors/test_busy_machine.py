"""Trainer actors on a busy machine: every actor starts with the OpenMP / tokenizers settings of
:func:`services.trainer.ray.runtime.actor_env_vars` (threads that sleep between kernels instead of spinning), so a
step next to other busy processes is not slowed many times over (docs/benchmarks.md, "A step on a busy
machine")."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from marti.config import load_config
from services.trainer.ray.runtime import (
    ACTOR_ENV_VARS,
    GOMP_SPIN_COUNT,
    RayRuntime,
    actor_env_vars,
    actor_threads,
)

ROOT = Path(__file__).resolve().parents[4]


def test_actor_env_vars_make_openmp_threads_sleep_and_match_the_torch_threads():
    env = actor_env_vars(2, environ={})
    assert env["OMP_WAIT_POLICY"] == "PASSIVE"
    assert env["KMP_BLOCKTIME"] == "0"
    assert env["GOMP_SPINCOUNT"] == GOMP_SPIN_COUNT == "3000"
    assert env["TOKENIZERS_PARALLELISM"] == "false"
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "2"
    assert set(ACTOR_ENV_VARS) <= set(env)


def test_actor_env_vars_leave_what_the_user_set():
    env = actor_env_vars(1, environ={"OMP_WAIT_POLICY": "ACTIVE", "OMP_NUM_THREADS": "4"})
    assert "OMP_WAIT_POLICY" not in env and "OMP_NUM_THREADS" not in env
    assert "GOMP_SPINCOUNT" not in env  # an explicit count would override the user's ACTIVE
    assert env["MKL_NUM_THREADS"] == "1" and env["KMP_BLOCKTIME"] == "0"
    assert "GOMP_SPINCOUNT" not in actor_env_vars(1, environ={"GOMP_SPINCOUNT": "10"})


@pytest.mark.parametrize(("cpus", "threads"), [(0.01, 1), (0.66, 1), (1.0, 1), (2.0, 2), (3.5, 3)])
def test_actor_threads_are_the_whole_cpus_of_the_bundle(cpus, threads):
    assert actor_threads(cpus, environ={}) == threads


@pytest.mark.parametrize(
    ("setting", "cpus", "threads"), [("1", 2.0, 1), ("3", 1.0, 3), ("4,2", 2.0, 4), (" 2 ", 1.0, 2)]
)
def test_the_users_omp_num_threads_sets_the_actor_threads(setting, cpus, threads):
    """A user's ``OMP_NUM_THREADS`` is what torch uses in the actor (its first level for a nested list), not the
    bundle's CPUs: ``torch.set_num_threads`` in the actor would otherwise override it."""
    assert actor_threads(cpus, environ={"OMP_NUM_THREADS": setting}) == threads


@pytest.mark.parametrize("setting", ["0", "-1", "two", "1.5", ",2"])
def test_an_omp_num_threads_that_is_not_a_positive_integer_leaves_the_bundles_cpus(setting, caplog):
    assert actor_threads(2.0, environ={"OMP_NUM_THREADS": setting}) == 2
    assert f"OMP_NUM_THREADS={setting!r} is not a positive integer" in caplog.text


def test_an_empty_omp_num_threads_is_unset():
    assert actor_threads(3.0, environ={"OMP_NUM_THREADS": ""}) == 3


def _environ(pid: int) -> dict[str, str]:
    """The environment a process started with (what the OpenMP runtime read when it loaded)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(): v.decode(errors="replace") for k, v in pairs}


def _prestarted_workers() -> list[str]:
    """Log files of the running Ray's workers started for no job (job id ``ffffffff``): the raylet's prestarted
    idle default workers. Ray kills surplus idle workers after about a second, so their log files are what lasts."""
    import ray

    logs = Path(ray._private.worker._global_node.get_session_dir_path()) / "logs"
    return sorted(p.name for p in logs.glob("worker-*-ffffffff-*.out"))


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc/<pid>/environ (Linux)")
def test_a_real_ray_actor_starts_with_passive_openmp_threads(monkeypatch):
    """The job's policy actor, a Ray process of its own, runs at the driver's priority and starts with the
    settings (every kind of actor is started by the same call with its own thread count)."""
    import ray

    for name in (*ACTOR_ENV_VARS, "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAY_AUTH_MODE"):
        monkeypatch.delenv(name, raising=False)
    # As in the demo (examples/resource_allocation.yaml): one team actor on the 2 CPUs of the local Ray.
    runtime = RayRuntime(load_config(ROOT / "examples" / "tiny.yaml", ["ray.num_cpus_per_worker=2"]))
    starts_ray = not ray.is_initialized()
    try:
        runtime.start()
        pid = runtime.worker_pids["policy_worker"]
        assert pid != os.getpid()
        env = _environ(pid)
        names = (*ACTOR_ENV_VARS, "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
        settings = {k: env.get(k) for k in names}
        assert settings == actor_env_vars(2, environ={}), settings
        assert runtime.actor_info["policy_worker"]["torch_threads"] == 2  # the bundle's 2 CPUs reach torch
        # Ray's default would start it at niceness 15: ~1/30 of a normal process's CPU share on a busy machine
        assert os.getpriority(os.PRIO_PROCESS, pid) == os.getpriority(os.PRIO_PROCESS, 0)
        if starts_ray:  # no idle default workers prestarted for the driver (LOCAL_RAY_SYSTEM_CONFIG)
            assert _prestarted_workers() == []
    finally:
        runtime.shutdown()
    if starts_ray:  # ray.init set RAY_AUTH_MODE=token for its local cluster; a later job must not inherit it
        assert "RAY_AUTH_MODE" not in os.environ
