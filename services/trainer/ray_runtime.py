"""Ray orchestration of the policy workers: local ``ray.init`` or an existing cluster, one placement group with
a bundle per actor sized from the config, released when the job ends or fails.

``per_agent`` mode: one :class:`~services.trainer.worker.PolicyWorker` actor per agent (its policy, reference,
critic and optimizer; its ``num_cpus`` / ``num_gpus`` reserved). ``lora`` and ``shared`` mode: one actor for
the team, which keeps a single copy of the base weights.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from marti.config import TrainConfig
from marti.errors import ResourceExhaustedError

_LOG = logging.getLogger("marti.trainer.ray")


class RayRuntime:
    """Owns the Ray connection, the placement group and the policy-worker actors of one job.

    Actor groups: in ``per_agent`` mode every agent gets its own actor (its model, reference, critic and
    optimizer) with its own bundle (``num_cpus`` / ``num_gpus`` of the agent, at least
    ``ray.num_cpus_per_worker``); in ``lora`` and ``shared`` mode the team shares one actor, which holds the
    single copy of the base weights. Calls are routed to the actor that holds the agent.

    Args:
        cfg: The training config (``ray`` section: address, CPUs, object store; agents' resources).
    """

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self._started_ray = False
        self._pg = None
        self._workers: list[Any] = []
        self._owner: dict[str, Any] = {}
        self.worker_pids: dict[str, int] = {}
        """Process id of each policy-worker actor (``policy_worker`` or ``policy_worker_<i>``), for monitoring."""

    def groups(self) -> list[list[str]]:
        """Agent names per actor: one per agent in ``per_agent`` mode, else the whole team in one."""
        names = [a.name for a in self.cfg.agents]
        return [[n] for n in names] if self.cfg.policy_mode == "per_agent" else [names]

    def _bundles(self, groups: list[list[str]], available: dict[str, float]) -> list[dict[str, float]]:
        cpu_total = available.get("CPU", 1.0)
        per_cpu = max(0.5, cpu_total / len(groups)) if len(groups) > 1 else cpu_total
        bundles = []
        for group in groups:
            agents = [self.cfg.agent(n) for n in group]
            want = max(float(self.cfg.ray.num_cpus_per_worker), *(a.num_cpus for a in agents))
            bundle = {"CPU": max(0.5, min(want, per_cpu))}
            gpus = max(float(self.cfg.ray.num_gpus_per_worker), *(a.num_gpus for a in agents))
            if gpus and self.cfg.device != "cpu" and available.get("GPU", 0.0) >= gpus * len(groups):
                bundle["GPU"] = gpus
            bundles.append(bundle)
        return bundles

    def start(self, timeout_s: float = 600.0) -> None:
        """Connect to (or start) Ray, reserve the placement group and start the worker actors.

        Raises:
            ResourceExhaustedError: the placement group could not be reserved within ``timeout_s``.
            NotFoundError: a model is not available locally (raised by the worker, named).
        """
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from services.trainer.worker import PolicyWorker

        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        # ray.init installs native SIGTERM/SIGINT handlers that kill the driver at once; keep the caller's
        # (marti train stops after the current step and shuts the stack down cleanly).
        saved = _python_signal_handlers()
        if not ray.is_initialized():
            address = self.cfg.ray.address or os.environ.get("RAY_ADDRESS")
            if address in (None, "", "local"):
                ray.init(
                    num_cpus=self.cfg.ray.num_cpus or os.cpu_count(),
                    object_store_memory=self.cfg.ray.object_store_memory,
                    include_dashboard=False,
                    log_to_driver=True,
                    configure_logging=True,
                    logging_level=logging.WARNING,
                )
            else:
                ray.init(address=address, log_to_driver=True, logging_level=logging.WARNING)
            self._started_ray = True
        _restore_signal_handlers(saved)
        groups = self.groups()
        bundles = self._bundles(groups, ray.available_resources())
        self._pg = placement_group(bundles, strategy="PACK")
        ready, _ = ray.wait([self._pg.ready()], timeout=timeout_s)
        if not ready:
            ray.util.remove_placement_group(self._pg)
            self._pg = None
            raise ResourceExhaustedError(f"could not reserve Ray resources {bundles} within {timeout_s:.0f}s")
        config = self.cfg.model_dump(mode="json")
        for i, (group, bundle) in enumerate(zip(groups, bundles, strict=True)):
            actor = ray.remote(PolicyWorker).options(
                num_cpus=bundle["CPU"],
                num_gpus=bundle.get("GPU", 0),
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self._pg, placement_group_bundle_index=i
                ),
                max_concurrency=1,
            )
            threads = max(1, int(bundle["CPU"]))
            worker = actor.remote(config, num_threads=threads, agents=None if len(groups) == 1 else group)
            self._workers.append(worker)
            for name in group:
                self._owner[name] = worker
        infos = self._get([w.ping.remote() for w in self._workers])
        for i, info in enumerate(infos):
            _LOG.info("policy worker ready: %s", info)
            self.worker_pids["policy_worker" if len(infos) == 1 else f"policy_worker_{i}"] = int(info["pid"])

    @staticmethod
    def _get(ref: Any) -> Any:
        import ray

        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as exc:  # re-raise the worker's own exception type
            cause = exc.as_instanceof_cause()
            raise cause from None
        except ray.exceptions.ActorDiedError as exc:
            init_error = getattr(exc, "error_msg", "") or str(exc)
            raise RuntimeError(f"policy worker died: {init_error}") from None

    def generate(self, agent: str, chats: list[list[dict[str, str]]], greedy: bool = False) -> list[Any]:
        """Generate on the agent's worker (see :meth:`PolicyWorker.generate`)."""
        return self._get(self._owner[agent].generate.remote(agent, chats, greedy))

    def train(self, agent: str, samples: list[Any]) -> dict[str, float]:
        """Train on the agent's worker (see :meth:`PolicyWorker.train`)."""
        return self._get(self._owner[agent].train.remote(agent, samples))

    def versions(self) -> dict[str, int]:
        """Policy version of every agent."""
        out: dict[str, int] = {}
        for part in self._get([w.versions.remote() for w in self._workers]):
            out.update(part)
        return out

    def _paths(self, path: str) -> list[str]:
        if len(self._workers) == 1:
            return [path]
        return [str(Path(path) / f"worker_{i}") for i in range(len(self._workers))]

    def save(self, path: str, data_position: dict[str, Any]) -> str:
        """Checkpoint every worker (see :meth:`PolicyWorker.save`); per-agent actors save under ``worker_<i>``."""
        paths = self._paths(path)
        self._get([w.save.remote(p, data_position) for w, p in zip(self._workers, paths, strict=True)])
        return path

    def load(self, path: str) -> dict[str, Any]:
        """Restore every worker (see :meth:`PolicyWorker.load`); returns the saved data position."""
        paths = self._paths(path)
        positions = self._get([w.load.remote(p) for w, p in zip(self._workers, paths, strict=True)])
        return positions[0]

    def shutdown(self) -> None:
        """Kill the workers, release the placement group, and stop Ray if this runtime started it."""
        import ray

        if not ray.is_initialized():
            return
        for worker in self._workers:
            ray.kill(worker)
        self._workers.clear()
        self._owner.clear()
        if self._pg is not None:
            ray.util.remove_placement_group(self._pg)
            self._pg = None
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False


def _python_signal_handlers() -> dict[int, object]:
    """The Python-level SIGINT/SIGTERM handlers (only in the main thread, where they can be set)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}


def _restore_signal_handlers(saved: dict[int, object]) -> None:
    import signal

    for sig, handler in saved.items():
        if handler is not None:
            signal.signal(sig, handler)
