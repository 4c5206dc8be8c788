"""Settings every test process needs before any gRPC import (see ``marti/__init__.py``)."""

import os
import sys

# The test process runs training jobs, which start Ray's processes (fork, then exec) while gRPC threads are busy:
# like the trainer's own entry points it turns gRPC's fork handlers off before the first gRPC import. Tests of
# fork-based worker pools run a fresh interpreter without this variable (tests/integration/rpc/test_fork_workers.py).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
# Two test workers share the machine's cores with the jobs they start: an OpenMP thread that finishes its share of
# a kernel sleeps instead of spinning on a core the other worker needs (as the trainer's actors do, see
# services/trainer/ray/runtime.py ACTOR_ENV_VARS). Read when torch's OpenMP runtime loads, so set before any torch
# import; the jobs' processes inherit it (docs/benchmarks.md, "The test suite's wall time").
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# And each computes on one thread: the test process and every actor of the jobs it starts (a driver's
# OMP_NUM_THREADS is its actors' torch threads, services/trainer/ray/runtime.py actor_threads). With three workers on
# two cores every second thread of a kernel waits to be woken for its share; one thread has no such wait. Measured
# on the 2-core machine, CPU s of each command's process tree (a cgroup), 2 threads against 1:
# tests/e2e/learning/test_external_agents.py 158.6 -> 137.9, tests/unit/trainer/models and learn 86.2 -> 77.5
# (docs/benchmarks.md, "The test suite's wall time").
os.environ.setdefault("OMP_NUM_THREADS", "1")
# A shell with PYTHONDONTWRITEBYTECODE set (this machine's does) makes every test process rewrite and compile every
# test module's asserts again at collection: about 8 of a collection's 21 CPU s, in each pytest-xdist worker, on
# every run. The test processes cache them (``__pycache__``, git-ignored), so a run in a tree that ran before
# collects in about 13 CPU s (docs/benchmarks.md, "The test suite's wall time"). Read at each write, so set before
# this directory's test modules are imported; the processes the tests start keep the shell's setting.
sys.dont_write_bytecode = False

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _no_token_from_the_shell(monkeypatch):
    """SDK clients fall back to ``MARTI_TOKEN`` and ``MARTI_<SERVICE>_TOKEN``: a token in the developer's shell
    must not change what a test sees. Tests that need one set it themselves."""
    for name in [
        n for n in os.environ if n == "MARTI_TOKEN" or (n.startswith("MARTI_") and n.endswith("_TOKEN"))
    ]:
        monkeypatch.delenv(name)


#: Seconds the interpreter may take to exit after the session before every thread's stack is printed and the run
#: fails (a thread left blocked by a test, e.g. an executor worker inside a store wait, would otherwise hold the
#: process, and CI, until its own deadline).
EXIT_WATCHDOG_S = 300


def pytest_unconfigure(config):
    """Arm the exit watchdog: a hang at interpreter exit becomes a stack dump and exit status 1.

    Only in the process that runs the session: a pytest-xdist worker is driven by its controller, which
    waits for it, and the watchdog would fire in a worker the controller keeps alive."""
    if hasattr(config, "workerinput"):
        return
    import faulthandler
    import sys

    faulthandler.dump_traceback_later(EXIT_WATCHDOG_S, exit=True, file=sys.__stderr__)
