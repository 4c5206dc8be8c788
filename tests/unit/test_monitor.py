"""services.trainer.observe.monitor: real child processes (a CPU burner, a memory holder, a sleeper) measured by psutil."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from marti.command.stack import ServiceProcess
from marti.errors import InvalidArgumentError
from services.trainer.observe.monitor import (
    MAX_INTERVAL_S,
    MAX_PROCESSES,
    MIN_INTERVAL_S,
    GpuProbe,
    GpuSnapshot,
    ResourceMonitor,
    child_service_pids,
    driver_pids,
    service_pids,
    wait_for_ticks,
)

BURN = "while True: pass"
SLEEP = "import time; print('ready', flush=True); time.sleep(120)"
HOLD_MB = 160
HOLD = f"import time; b = bytearray({HOLD_MB} * 2**20); b[::4096] = b'x' * len(b[::4096]); print('ready', flush=True); time.sleep(120)"
# A parent that starts a memory-holding child, so only include_children sees the memory.
PARENT = (
    "import subprocess, sys, time; "
    f"c = subprocess.Popen([sys.executable, '-c', {HOLD!r}], stdout=subprocess.PIPE); "
    "c.stdout.readline(); print('ready', flush=True); time.sleep(120)"
)


@pytest.fixture
def spawn():
    procs: list[subprocess.Popen] = []

    def start(code: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        if code != BURN:
            assert proc.stdout.readline().strip() == "ready"
        return proc

    yield start
    for proc in procs:
        for child in psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []:
            child.kill()
        proc.kill()
        proc.wait(10)


@pytest.mark.parametrize("interval_s", [MIN_INTERVAL_S, 1.0, MAX_INTERVAL_S])
def test_interval_edges_accepted(interval_s):
    assert ResourceMonitor({"me": os.getpid()}, interval_s=interval_s).interval_s == interval_s


@pytest.mark.parametrize("interval_s", [MIN_INTERVAL_S * 0.99, 0.0, -1.0, MAX_INTERVAL_S * 1.001])
def test_interval_out_of_range_is_named(interval_s):
    with pytest.raises(InvalidArgumentError, match=rf"interval_s {interval_s!r} outside"):
        ResourceMonitor({"me": os.getpid()}, interval_s=interval_s)


@pytest.mark.parametrize(
    ("pids", "needle"),
    [
        ({"a/b": 1}, "'a/b'"),
        ({"": 1}, "''"),
        ({"total": 1}, "'total'"),
        ({"host": 1}, "'host'"),
        ({"x" * 65: 1}, "'xxxx"),
        ({"me": 0}, "got 0"),
        ({"me": -5}, "got -5"),
        ({"me": True}, "got True"),
        ({"me": "12"}, "got '12'"),
    ],
)
def test_bad_names_and_pids_are_named(pids, needle):
    with pytest.raises(InvalidArgumentError, match=needle):
        ResourceMonitor(pids)


def test_process_count_limit_at_its_edge():
    me = os.getpid()
    mon = ResourceMonitor({f"p{i}": me for i in range(MAX_PROCESSES)}, interval_s=1.0)
    assert len(mon.pids) == MAX_PROCESSES
    with pytest.raises(InvalidArgumentError, match=f"MAX_PROCESSES is {MAX_PROCESSES}"):
        mon.add("one_more", me)
    with pytest.raises(InvalidArgumentError, match=f"{MAX_PROCESSES + 1} processes"):
        ResourceMonitor({f"p{i}": me for i in range(MAX_PROCESSES + 1)})


def test_include_children_must_name_known_processes():
    with pytest.raises(InvalidArgumentError, match="nobody"):
        ResourceMonitor({"me": os.getpid()}, include_children={"nobody"})


def test_cpu_burner_reads_busier_than_sleeper(spawn):
    burner, sleeper = spawn(BURN), spawn(SLEEP)
    with ResourceMonitor({"burner": burner.pid, "sleeper": sleeper.pid}, interval_s=0.1) as mon:
        mon.sample()  # discard start-up
        assert wait_for_ticks(mon, mon.ticks + 8, timeout_s=20)
        m = mon.sample()
    # The machine is shared (2 cores, other jobs): ask for a clear gap, not a full core.
    assert m["system/burner/cpu_percent"] > 20.0, m
    assert m["system/sleeper/cpu_percent"] < 5.0, m
    assert m["system/burner/alive"] == m["system/sleeper/alive"] == 1.0
    assert m["system/total/cpu_percent"] == pytest.approx(
        m["system/burner/cpu_percent"] + m["system/sleeper/cpu_percent"]
    )
    assert 0.0 <= m["system/host/cpu_percent"] <= 100.0


def test_rss_of_memory_holder_and_peak(spawn):
    holder, sleeper = spawn(HOLD), spawn(SLEEP)
    mon = ResourceMonitor({"holder": holder.pid, "sleeper": sleeper.pid}, interval_s=0.5)
    m = mon.sample()  # no thread: sample() ticks itself
    assert m["system/holder/rss_mb"] > HOLD_MB * 0.95, m
    assert m["system/sleeper/rss_mb"] < HOLD_MB / 2, m
    assert m["system/holder/rss_peak_mb"] >= m["system/holder/rss_mb"]
    expected = psutil.Process(holder.pid).memory_info().rss / 2**20
    assert m["system/holder/rss_mb"] == pytest.approx(expected, rel=0.05)
    assert m["system/total/rss_mb"] == pytest.approx(m["system/holder/rss_mb"] + m["system/sleeper/rss_mb"])


def test_children_count_only_when_asked(spawn):
    parent = spawn(PARENT)
    plain = ResourceMonitor({"parent": parent.pid}).sample()
    tree = ResourceMonitor({"parent": parent.pid}, include_children={"parent"}).sample()
    assert plain["system/parent/rss_mb"] < HOLD_MB / 2, plain
    assert tree["system/parent/rss_mb"] > HOLD_MB * 0.95, tree


def test_exited_process_reads_not_alive(spawn):
    sleeper, other = spawn(SLEEP), spawn(SLEEP)
    mon = ResourceMonitor({"gone": sleeper.pid, "other": other.pid}, interval_s=0.5)
    assert mon.sample()["system/gone/alive"] == 1.0
    sleeper.kill()
    sleeper.wait(10)
    m = mon.sample()
    assert m["system/gone/alive"] == 0.0
    assert "system/gone/rss_mb" not in m and "system/gone/cpu_percent" not in m
    assert m["system/total/rss_mb"] == pytest.approx(m["system/other/rss_mb"])


def test_add_late_process_and_thread_stops(spawn):
    mon = ResourceMonitor({"me": os.getpid()}, interval_s=MIN_INTERVAL_S).start()
    try:
        holder = spawn(HOLD)
        mon.add("late", holder.pid)
        assert wait_for_ticks(mon, 3, timeout_s=10)
        assert mon.sample()["system/late/rss_mb"] > HOLD_MB * 0.95
    finally:
        mon.stop()
    ticks = mon.ticks
    time.sleep(5 * MIN_INTERVAL_S)
    assert mon.ticks == ticks


def test_host_and_no_gpu_keys_on_cpu_machine():
    m = ResourceMonitor(driver_pids()).sample()
    vm = psutil.virtual_memory()
    assert m["system/host/mem_used_mb"] + m["system/host/mem_available_mb"] == pytest.approx(
        vm.total / 2**20, rel=0.01
    )
    assert m["system/driver/rss_mb"] > 10
    if not GpuProbe().available:
        assert not [k for k in m if "gpu" in k], m


class FixedGpuProbe(GpuProbe):
    """A GPU source that reports a given snapshot (the accounting is what is under test, not NVML)."""

    def __init__(self, snapshot: GpuSnapshot) -> None:
        self.snapshot = snapshot

    @property
    def available(self) -> bool:
        return True

    def read(self) -> GpuSnapshot:
        return self.snapshot


def test_gpu_memory_is_attributed_by_pid_and_summed_over_children(spawn):
    parent = spawn(PARENT)
    child = psutil.Process(parent.pid).children()[0].pid
    snap = GpuSnapshot(
        by_pid={parent.pid: 100 * 2**20, child: 50 * 2**20, 999_999_999: 7 * 2**20},
        devices={0: {"used_mb": 157.0, "total_mb": 1000.0, "util_percent": 30.0}},
    )
    tree = ResourceMonitor({"p": parent.pid}, include_children={"p"}, gpu_probe=FixedGpuProbe(snap)).sample()
    plain = ResourceMonitor({"p": parent.pid}, gpu_probe=FixedGpuProbe(snap)).sample()
    assert tree["system/p/gpu_mb"] == pytest.approx(150.0)
    assert plain["system/p/gpu_mb"] == pytest.approx(100.0)
    assert plain["system/total/gpu_mb"] == pytest.approx(100.0)
    assert plain["system/gpu0/used_mb"] == 157.0 and plain["system/gpu0/util_percent"] == 30.0


def test_service_pids_from_stack_processes(spawn):
    broker, env = spawn(SLEEP), spawn(SLEEP)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(10)

    class Stack:  # what LocalStack.running holds, built from real processes
        running = {
            "broker": ServiceProcess("broker", broker, "127.0.0.1:1"),
            "env-server": ServiceProcess("env-server", env, "127.0.0.1:2"),
            "store": ServiceProcess("store", dead, "127.0.0.1:3"),
        }

    assert service_pids(Stack) == {"broker": broker.pid, "env_server": env.pid}


def test_child_service_pids_finds_marti_cli_children(spawn):
    # Real children whose command lines look like LocalStack's (`python -m marti.command.main NAME ...`); `-m marti.command.main`
    # is given to a script that sleeps, so no service has to start.
    sleeper = "import sys, time; print('ready', flush=True); time.sleep(120)"
    broker = subprocess.Popen(
        [sys.executable, "-c", sleeper, "-m", "marti.command.main", "broker", "--port", "0"],
        stdout=subprocess.PIPE,
    )
    env = subprocess.Popen(
        [sys.executable, "-c", sleeper, "-m", "marti.command.main", "env-server"], stdout=subprocess.PIPE
    )
    other = spawn(SLEEP)
    try:
        for p in (broker, env):
            assert p.stdout.readline().strip() == b"ready"
        found = child_service_pids()
        assert found == {"broker": broker.pid, "env_server": env.pid}, found
        assert other.pid not in found.values()
        assert child_service_pids(other.pid) == {}
    finally:
        for p in (broker, env):
            p.kill()
            p.wait(10)
