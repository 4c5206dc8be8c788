"""Ray orchestration of the policy worker: local ``ray.init`` or an existing cluster, a placement group sized
from the config, one :class:`~services.trainer.worker.PolicyWorker` actor per team, released on shutdown.

On a CPU machine the whole team (LoRA adapters on one base) lives in one actor, which keeps a single copy of
the base weights; with ``policy.mode: per_agent`` on GPUs each agent's ``num_gpus`` is reserved in the bundle.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from marti.config import TrainConfig
from marti.errors import ResourceExhaustedError

_LOG = logging.getLogger("marti.trainer.ray")


class RayRuntime:
    """Owns the Ray connection, the placement group and the worker actor of one job.

    Args:
        cfg: The training config (``ray`` section: address, CPUs, object store; agents' ``num_gpus``).
    """

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self._started_ray = False
        self._pg = None
        self._worker = None

    def _bundle(self, available: dict[str, float]) -> dict[str, float]:
        cpus = max(1.0, min(float(self.cfg.ray.num_cpus_per_worker), available.get("CPU", 1.0)))
        bundle = {"CPU": cpus}
        gpus = (
            sum(a.num_gpus for a in self.cfg.agents)
            if self.cfg.policy_mode == "per_agent"
            else max((a.num_gpus for a in self.cfg.agents), default=0.0)
        )
        gpus = max(gpus, float(self.cfg.ray.num_gpus_per_worker))
        if gpus and available.get("GPU", 0.0) >= gpus and self.cfg.device != "cpu":
            bundle["GPU"] = gpus
        return bundle

    def start(self, timeout_s: float = 600.0) -> None:
        """Connect to (or start) Ray, reserve the placement group and start the worker actor.

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
        bundle = self._bundle(ray.available_resources())
        self._pg = placement_group([bundle], strategy="PACK")
        ready, _ = ray.wait([self._pg.ready()], timeout=timeout_s)
        if not ready:
            ray.util.remove_placement_group(self._pg)
            self._pg = None
            raise ResourceExhaustedError(f"could not reserve Ray resources {bundle} within {timeout_s:.0f}s")
        actor = ray.remote(PolicyWorker).options(
            num_cpus=bundle["CPU"],
            num_gpus=bundle.get("GPU", 0),
            scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=self._pg),
            max_concurrency=1,
        )
        self._worker = actor.remote(self.cfg.model_dump(mode="json"), num_threads=int(bundle["CPU"]))
        info = self._get(self._worker.ping.remote())
        _LOG.info("policy worker ready: %s (bundle %s)", info, bundle)

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
        """Generate on the worker (see :meth:`PolicyWorker.generate`)."""
        return self._get(self._worker.generate.remote(agent, chats, greedy))

    def train(self, agent: str, samples: list[Any]) -> dict[str, float]:
        """Train on the worker (see :meth:`PolicyWorker.train`)."""
        return self._get(self._worker.train.remote(agent, samples))

    def versions(self) -> dict[str, int]:
        """Policy versions on the worker."""
        return self._get(self._worker.versions.remote())

    def save(self, path: str, data_position: dict[str, Any]) -> str:
        """Checkpoint the worker (see :meth:`PolicyWorker.save`)."""
        return self._get(self._worker.save.remote(path, data_position))

    def load(self, path: str) -> dict[str, Any]:
        """Restore the worker (see :meth:`PolicyWorker.load`)."""
        return self._get(self._worker.load.remote(path))

    def shutdown(self) -> None:
        """Kill the worker, release the placement group, and stop Ray if this runtime started it."""
        import ray

        if not ray.is_initialized():
            return
        if self._worker is not None:
            ray.kill(self._worker)
            self._worker = None
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
