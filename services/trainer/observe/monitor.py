"""Resource monitor: CPU, memory and GPU memory of the processes a training job is made of.

A :class:`ResourceMonitor` watches named processes (the driver, the Ray policy worker(s), the services of the
embedded stack) from a background thread with :mod:`psutil`, and hands the training loop one flat dict of
metrics per step, all under ``system/``, so they land in ``metrics.jsonl``, TensorBoard and the report like
any other metric::

    monitor = ResourceMonitor({"driver": os.getpid(), **service_pids(stack), **actor_pids(workers)})
    monitor.start()
    ...
    metrics.update(monitor.sample())      # every step
    ...
    monitor.stop()

Metric keys (``NAME`` is a key of ``pids``; see docs/operations_monitoring.md):

- ``system/NAME/cpu_percent``: mean CPU use since the previous :meth:`ResourceMonitor.sample`, percent of one
  core (a process busy on two cores reads 200), user + system time, children included when asked.
- ``system/NAME/rss_mb``: resident set size at the last tick, MiB (2**20 bytes).
- ``system/NAME/rss_peak_mb``: highest ``rss_mb`` seen since the previous ``sample()``, MiB.
- ``system/NAME/gpu_mb``: GPU memory the process holds on all devices at the last tick, MiB (only when NVML
  sees GPU processes).
- ``system/NAME/alive``: 1 while the process exists, 0 once it has exited (its other keys are then omitted).
- ``system/total/cpu_percent``, ``system/total/rss_mb``, ``system/total/gpu_mb``: sums over live processes.
- ``system/host/cpu_percent`` (mean over all cores, 0-100), ``system/host/mem_used_mb``,
  ``system/host/mem_available_mb``: the whole machine.
- ``system/gpuI/used_mb``, ``system/gpuI/total_mb``, ``system/gpuI/util_percent``: device I (when torch sees
  CUDA; utilisation needs NVML).

psutil sees processes on this host only: a Ray actor on another node reads as not alive here.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import psutil

from marti.errors import InvalidArgumentError

__all__ = [
    "MAX_INTERVAL_S",
    "MAX_PROCESSES",
    "MIN_INTERVAL_S",
    "GpuProbe",
    "GpuSnapshot",
    "ResourceMonitor",
    "actor_pids",
    "child_service_pids",
    "driver_pids",
    "service_pids",
    "wait_for_ticks",
]

MIN_INTERVAL_S = 0.05
"""Shortest sampling interval, seconds (below it the sampler itself costs noticeable CPU)."""
MAX_INTERVAL_S = 3600.0
"""Longest sampling interval, seconds."""
MAX_PROCESSES = 256
"""Most named processes one monitor watches."""
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_MB = float(2**20)
_RESERVED = ("total", "host")


@dataclass(frozen=True)
class GpuSnapshot:
    """GPU memory at one instant.

    Attributes:
        by_pid: Bytes of GPU memory held per process id (all devices summed); empty without NVML.
        devices: Per device index: ``{"used_mb", "total_mb"}`` and, with NVML, ``"util_percent"``.
    """

    by_pid: dict[int, int] = field(default_factory=dict)
    devices: dict[int, dict[str, float]] = field(default_factory=dict)


class GpuProbe:
    """Reads GPU memory per process (NVML, package ``nvidia-ml-py``) and per device.

    Per-process figures need NVML; without it, device totals come from ``torch.cuda.mem_get_info``, read only
    when this process has already initialised CUDA (so the monitor never creates a CUDA context). Without CUDA
    both are empty and :attr:`available` is False.
    """

    def __init__(self) -> None:
        self._nvml: Any = None
        self._torch: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
        except Exception:  # noqa: BLE001 - no package, no driver or no device: NVML is simply absent
            self._nvml = None
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            self._torch = torch

    @property
    def available(self) -> bool:
        """True when either NVML or torch can see a CUDA device."""
        return self._nvml is not None or self._torch is not None

    def read(self) -> GpuSnapshot:
        """One snapshot (empty when nothing is available; a failing NVML call yields an empty part)."""
        if self._nvml is not None:
            try:
                return self._read_nvml()
            except Exception:  # noqa: BLE001 - a GPU that disappears must not kill the monitor
                return GpuSnapshot()
        if self._torch is not None and self._torch.cuda.is_initialized():
            devices = {}
            for i in range(self._torch.cuda.device_count()):
                free, total = self._torch.cuda.mem_get_info(i)
                devices[i] = {"used_mb": (total - free) / _MB, "total_mb": total / _MB}
            return GpuSnapshot({}, devices)
        return GpuSnapshot()

    def _read_nvml(self) -> GpuSnapshot:
        nv = self._nvml
        by_pid: dict[int, int] = {}
        devices: dict[int, dict[str, float]] = {}
        for i in range(nv.nvmlDeviceGetCount()):
            handle = nv.nvmlDeviceGetHandleByIndex(i)
            mem = nv.nvmlDeviceGetMemoryInfo(handle)
            devices[i] = {
                "used_mb": mem.used / _MB,
                "total_mb": mem.total / _MB,
                "util_percent": float(nv.nvmlDeviceGetUtilizationRates(handle).gpu),
            }
            procs = list(nv.nvmlDeviceGetComputeRunningProcesses(handle))
            procs += list(nv.nvmlDeviceGetGraphicsRunningProcesses(handle))
            for p in procs:
                used = p.usedGpuMemory or 0  # None when the driver does not say (e.g. some containers)
                by_pid[int(p.pid)] = by_pid.get(int(p.pid), 0) + int(used)
        return GpuSnapshot(by_pid, devices)


@dataclass
class _Acc:
    """What one process accumulated since the last ``sample()``."""

    cpu_sum: float = 0.0
    ticks: int = 0
    rss_mb: float = 0.0
    rss_peak_mb: float = 0.0
    gpu_mb: float | None = None
    alive: bool = True


def _check_pids(pids: Mapping[str, int]) -> dict[str, int]:
    if len(pids) > MAX_PROCESSES:
        raise InvalidArgumentError(f"{len(pids)} processes to watch; MAX_PROCESSES is {MAX_PROCESSES}")
    out = {}
    for name, pid in pids.items():
        if not isinstance(name, str) or not _NAME.match(name) or name in _RESERVED:
            raise InvalidArgumentError(
                f"process name {name!r} must match {_NAME.pattern} and not be one of {_RESERVED}"
            )
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
            raise InvalidArgumentError(f"pid of {name!r} must be a positive int, got {pid!r}")
        out[name] = pid
    return out


class ResourceMonitor:
    """Samples CPU, RSS and GPU memory of named processes from a background thread.

    Args:
        pids: Process id per name; names become metric key parts (``system/NAME/...``), match
            ``[A-Za-z0-9_.-]{1,64}`` and may not be ``total`` or ``host``; at most :data:`MAX_PROCESSES`.
        interval_s: Seconds between ticks of the sampling thread, in
            [:data:`MIN_INTERVAL_S`, :data:`MAX_INTERVAL_S`].
        include_children: Names whose child processes (recursively) count towards their figures, e.g. the
            driver, whose children are Ray's own processes when it started Ray.
        gpu_probe: Reads GPU memory; ``None`` builds a :class:`GpuProbe`. Pass ``GpuProbe`` subclasses to
            read other sources.

    Raises:
        InvalidArgumentError: A bad name, pid or interval (the value is named).
    """

    def __init__(
        self,
        pids: Mapping[str, int],
        interval_s: float = 1.0,
        *,
        include_children: tuple[str, ...] | set[str] = (),
        gpu_probe: GpuProbe | None = None,
    ) -> None:
        if not MIN_INTERVAL_S <= float(interval_s) <= MAX_INTERVAL_S:
            raise InvalidArgumentError(
                f"interval_s {interval_s!r} outside [{MIN_INTERVAL_S}, {MAX_INTERVAL_S}] seconds"
            )
        self.interval_s = float(interval_s)
        self._pids = _check_pids(pids)
        unknown = set(include_children) - set(self._pids)
        if unknown:
            raise InvalidArgumentError(f"include_children names unknown processes {sorted(unknown)}")
        self._children_of = set(include_children)
        self._gpu = gpu_probe if gpu_probe is not None else GpuProbe()
        self._lock = threading.Lock()
        self._procs: dict[int, psutil.Process] = {}
        self._acc: dict[str, _Acc] = {}
        self._host_cpu_sum = 0.0
        self._host_ticks = 0
        self._devices: dict[int, dict[str, float]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.ticks = 0
        """Ticks taken so far (thread and synchronous ones)."""
        psutil.cpu_percent(None)  # prime the host counter: the next call measures from here
        for name in self._pids:
            self._acc[name] = _Acc()
            self._measure(name, prime=True)

    @property
    def pids(self) -> dict[str, int]:
        """A copy of the watched name -> pid table."""
        with self._lock:
            return dict(self._pids)

    def add(self, name: str, pid: int) -> None:
        """Watch one more process (or re-point a name at a new pid), e.g. a worker started after the monitor.

        Raises:
            InvalidArgumentError: Bad name or pid, or :data:`MAX_PROCESSES` would be exceeded.
        """
        with self._lock:
            merged = {**self._pids, name: pid}
            _check_pids(merged)
            self._pids = merged
            self._acc[name] = _Acc()
            self._measure(name, prime=True)

    def start(self) -> ResourceMonitor:
        """Start the sampling thread (idempotent). Returns self, so ``ResourceMonitor(...).start()`` chains."""
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="resource-monitor", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the sampling thread and wait up to ``timeout_s`` seconds for it (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def __enter__(self) -> ResourceMonitor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.tick()

    def tick(self) -> None:
        """Take one measurement of every process now (the thread calls this every ``interval_s``)."""
        gpu = self._gpu.read() if self._gpu.available else GpuSnapshot()
        with self._lock:
            for name in self._pids:
                self._measure(name, gpu=gpu)
            self._host_cpu_sum += psutil.cpu_percent(None)
            self._host_ticks += 1
            self._devices = gpu.devices
            self.ticks += 1

    def _process(self, pid: int) -> psutil.Process:
        proc = self._procs.get(pid)
        if proc is None:
            proc = self._procs[pid] = psutil.Process(pid)
            proc.cpu_percent(None)  # first call primes the counter and returns 0.0
        return proc

    def _tree(self, name: str) -> list[psutil.Process]:
        root = self._process(self._pids[name])
        if name not in self._children_of:
            return [root]
        try:
            kids = root.children(recursive=True)
        except psutil.Error:
            kids = []
        return [root] + [self._process(k.pid) for k in kids]

    def _measure(self, name: str, *, gpu: GpuSnapshot | None = None, prime: bool = False) -> None:
        acc = self._acc[name]
        try:
            procs = self._tree(name)
        except psutil.Error:  # NoSuchProcess, AccessDenied, ZombieProcess
            acc.alive = False
            return
        cpu = rss = 0.0
        gpu_bytes = 0
        for proc in procs:
            try:
                with proc.oneshot():
                    cpu += proc.cpu_percent(None)
                    rss += proc.memory_info().rss / _MB
            except psutil.Error:
                self._procs.pop(proc.pid, None)
                if proc.pid == self._pids[name]:
                    acc.alive = False
                    return
                continue
            if gpu is not None:
                gpu_bytes += gpu.by_pid.get(proc.pid, 0)
        acc.alive = True
        acc.rss_mb = rss
        acc.rss_peak_mb = max(acc.rss_peak_mb, rss)
        if prime:
            return
        acc.cpu_sum += cpu
        acc.ticks += 1
        if gpu is not None and gpu.by_pid:
            acc.gpu_mb = gpu_bytes / _MB

    def sample(self) -> dict[str, float]:
        """The metrics since the previous call (see the module docstring for every key and unit).

        Takes a tick first when none happened since the previous call (the thread is not started, or the
        caller asks more often than ``interval_s``), so every call returns fresh figures. Resets the CPU means
        and RSS peaks.

        Returns:
            Flat ``{"system/NAME/metric": value}``; values are floats.
        """
        with self._lock:
            fresh = self._host_ticks > 0
        if not fresh:
            self.tick()
        out: dict[str, float] = {}
        total_cpu = total_rss = total_gpu = 0.0
        any_gpu = False
        with self._lock:
            for name in self._pids:
                acc = self._acc[name]
                out[f"system/{name}/alive"] = 1.0 if acc.alive else 0.0
                if acc.alive:
                    cpu = acc.cpu_sum / acc.ticks if acc.ticks else 0.0
                    out[f"system/{name}/cpu_percent"] = cpu
                    out[f"system/{name}/rss_mb"] = acc.rss_mb
                    out[f"system/{name}/rss_peak_mb"] = acc.rss_peak_mb
                    total_cpu += cpu
                    total_rss += acc.rss_mb
                    if acc.gpu_mb is not None:
                        out[f"system/{name}/gpu_mb"] = acc.gpu_mb
                        total_gpu += acc.gpu_mb
                        any_gpu = True
                self._acc[name] = _Acc(rss_mb=acc.rss_mb, rss_peak_mb=acc.rss_mb, alive=acc.alive)
            out["system/total/cpu_percent"] = total_cpu
            out["system/total/rss_mb"] = total_rss
            if any_gpu:
                out["system/total/gpu_mb"] = total_gpu
            out["system/host/cpu_percent"] = self._host_cpu_sum / self._host_ticks
            self._host_cpu_sum, self._host_ticks = 0.0, 0
            for i, dev in sorted(self._devices.items()):
                for key, value in dev.items():
                    out[f"system/gpu{i}/{key}"] = float(value)
        vm = psutil.virtual_memory()
        out["system/host/mem_used_mb"] = (vm.total - vm.available) / _MB
        out["system/host/mem_available_mb"] = vm.available / _MB
        return out


def _metric_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:64]


def service_pids(stack: Any) -> dict[str, int]:
    """Name -> pid of every service a :class:`marti.command.stack.LocalStack` runs (``env-server`` -> ``env_server``).

    Args:
        stack: A started ``LocalStack`` (anything with ``running: {name: ServiceProcess}``).

    Returns:
        ``{"broker": pid, "env_server": pid, "store": pid, ...}`` for the processes still running.
    """
    return {
        _metric_name(name.replace("-", "_")): svc.process.pid
        for name, svc in stack.running.items()
        if svc.process.poll() is None
    }


def child_service_pids(parent_pid: int | None = None) -> dict[str, int]:
    """Name -> pid of the marti services running as direct children of a process (default: this one).

    Finds the embedded stack that ``marti train`` started (``LocalStack`` runs ``python -m marti.command.main NAME``)
    without being handed the stack object. ``env-server`` becomes ``env_server``.

    Args:
        parent_pid: The parent; ``None`` means ``os.getpid()``.

    Returns:
        ``{"broker": pid, "env_server": pid, "store": pid, ...}``; empty when there are none (or the parent is
        gone).
    """
    services = {"broker", "env-server", "store", "trainer"}
    out: dict[str, int] = {}
    try:
        children = psutil.Process(parent_pid or os.getpid()).children(recursive=False)
    except psutil.Error:
        return out
    for child in children:
        try:
            cmd = child.cmdline()
        except psutil.Error:
            continue
        for i in range(len(cmd) - 2):
            if cmd[i] == "-m" and cmd[i + 1] == "marti.command.main" and cmd[i + 2] in services:
                out[_metric_name(cmd[i + 2].replace("-", "_"))] = child.pid
                break
    return out


def actor_pids(actors: Mapping[str, Any], timeout_s: float = 30.0) -> dict[str, int]:
    """Name -> pid of Ray actors that answer ``ping()`` with a dict holding ``"pid"`` (as ``PolicyWorker``).

    Args:
        actors: Metric name (e.g. ``policy_worker``) -> actor handle.
        timeout_s: Time to wait for all pings, seconds.

    Returns:
        The pids; actors on another node are included (their pid means nothing here; the monitor will report
        them as not alive on this host).

    Raises:
        InvalidArgumentError: An answer without an integer ``pid`` (the actor is named).
    """
    import ray

    names = list(actors)
    answers = ray.get([actors[n].ping.remote() for n in names], timeout=timeout_s)
    out = {}
    for name, info in zip(names, answers, strict=True):
        pid = info.get("pid") if isinstance(info, dict) else None
        if not isinstance(pid, int):
            raise InvalidArgumentError(f"actor {name!r} answered ping() without an integer pid: {info!r}")
        out[_metric_name(name)] = pid
    return out


def driver_pids(extra: Mapping[str, int] | None = None) -> dict[str, int]:
    """``{"driver": os.getpid()}`` merged with ``extra``: the usual start of a job's pid table."""
    return {"driver": os.getpid(), **(extra or {})}


def wait_for_ticks(monitor: ResourceMonitor, n: int, timeout_s: float) -> bool:
    """Block until ``monitor`` has taken ``n`` ticks in total or ``timeout_s`` seconds passed; True if it has."""
    deadline = time.monotonic() + timeout_s
    while monitor.ticks < n:
        if time.monotonic() >= deadline:
            return False
        time.sleep(min(0.01, monitor.interval_s / 4))
    return True
