"""Hosting the inference gateway for a training job (``gateway`` section, :mod:`services.gateway`).

While the job runs, :class:`GatewayHost` serves every agent's current policy over OpenAI-compatible HTTP and gRPC
from the job's actors (:class:`~services.trainer.rollout.serving.gateway_backend.TrainerBackend`); with ``rollout.source``
external or mixed, every episode a client reports goes into the trainable agents' tables. Its addresses are
printed, logged and written to ``<run_dir>/gateway.json`` while it serves, and its counters become the step
metrics ``gateway/<counter>``.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

from marti.config import TrainConfig
from marti.types.trajectory import Trajectory

_LOG = logging.getLogger("marti.trainer")


def gateway_limits(cfg: TrainConfig) -> Any:
    """The inference gateway's :class:`~services.gateway.core.limits.GatewayLimits` from the ``gateway`` section,
    ``external.episode_timeout_s`` and :attr:`~marti.config.TrainConfig.gateway_resident_versions`."""
    from services.gateway.core.limits import GatewayLimits

    g = cfg.gateway
    return GatewayLimits(
        max_batch=g.max_batch,
        max_wait_ms=g.max_wait_ms,
        max_queue=g.max_queue,
        max_n=g.max_n,
        max_open_episodes=g.max_open_episodes,
        max_calls_per_episode=g.max_calls_per_episode,
        episode_timeout_s=cfg.external.episode_timeout_s,
        resident_versions=cfg.gateway_resident_versions,
        max_request_bytes=g.max_request_bytes,
        max_stop=g.max_stop,
        max_stop_chars=g.max_stop_chars,
        max_id_chars=g.max_id_chars,
        max_group_size=g.max_group_size,
        max_backlog_episodes=g.max_backlog_episodes,
        report_wait_s=g.report_wait_s,
        max_tools_chars=g.max_tools_chars,
        max_stored_responses=g.max_stored_responses,
    )


class GatewayHost:
    """The gateway of one job: started by :meth:`start`, stopped by :meth:`stop`.

    Attributes:
        gateway: The :class:`~services.gateway.core.gateway.Gateway`, while it runs (else None).
        backend: Its :class:`~services.trainer.rollout.serving.gateway_backend.TrainerBackend` (mirrors the actors'
            versions; :meth:`refresh` after every step's updates), while it runs.
        server: Its :class:`~services.gateway.server.GatewayServer` (HTTP and gRPC endpoints), while it runs.
        address: What ``<run_dir>/gateway.json`` holds, while it runs.
        untrained_external: Reported episodes no update took (set by :meth:`stop`; see
            :attr:`services.trainer.job.run.summary.RunSummary.untrained_external`).

    Args:
        cfg: The training config.
        token: The bearer token the gateway requires (``Addresses.token``; None: ``MARTI_TOKEN``).
    """

    def __init__(self, cfg: TrainConfig, token: str | None) -> None:
        self.cfg = cfg
        self.token = token
        self.gateway: Any = None
        self.backend: Any = None
        self.server: Any = None
        self.address: dict[str, Any] | None = None
        self.run_dir: Path | None = None  # where gateway.json is, while it runs
        self.untrained_external = 0

    def start(self, runtime: Any, writer: Any, run_dir: Path) -> dict[str, Any]:
        """Serve every agent's policy over HTTP and gRPC for the rest of the job.

        Args:
            runtime: The job's :class:`~services.trainer.ray.runtime.RayRuntime` (the actors served from).
            writer: The job's :class:`~services.trainer.data.episode_writer.EpisodeWriter`; with
                ``rollout.source`` external or mixed every reported episode is inserted as external.
            run_dir: Where ``gateway.json`` is written (``{"http": url, "grpc": address, "models": [...]}``).

        Returns:
            What ``gateway.json`` holds.

        Raises:
            UnavailableError: A port could not be bound.
            NotFoundError: An agent's tokenizer is not available locally.
        """
        from services.gateway.core.gateway import Gateway
        from services.gateway.server import GatewayServer
        from services.trainer.rollout.serving.gateway_backend import TrainerBackend

        cfg = self.cfg
        assert writer is not None
        self.run_dir = run_dir
        backend = TrainerBackend.for_job(runtime, cfg)
        sink = None
        if cfg.rollout.source != "builtin":

            def sink(episode: dict[str, Trajectory]) -> None:
                # a wait for room in a full table ends when the gateway closes (its backlog is then counted lost)
                writer.insert_episode(episode, external=True, stop=gateway.closing)

        bounds = {a: cfg.max_staleness_for(a) for a in cfg.tuning_agents}  # reports name calls past them
        gateway = Gateway(
            backend,
            gateway_limits(cfg),
            sink=sink,
            trainable=cfg.tuning_agents,
            max_staleness=bounds,
            tool_parser=cfg.gateway.tool_parser,
            tool_parsers=cfg.gateway.tool_parsers,
        )
        g = cfg.gateway
        server = GatewayServer(
            gateway, host=g.host, http_port=g.http_port, grpc_port=g.grpc_port, token=self.token
        )
        http_url, grpc_address = server.start()
        self.gateway, self.backend, self.server = gateway, backend, server
        self.address = {
            "http": http_url,
            "grpc": grpc_address,
            "models": [m.id for m in gateway.models()],
        }
        self._write_address()
        trained = (
            "" if sink is not None else " (rollout.source=builtin: reported episodes are not trained on)"
        )
        print(f"gateway listening on {http_url} (gRPC {grpc_address}){trained}", flush=True)
        _LOG.info("gateway listening on %s (gRPC %s)%s", http_url, grpc_address, trained)
        return self.address

    def linger(self, stop_event: threading.Event) -> None:
        """Keep serving the trained policies for ``gateway.linger_s`` seconds after the last step (clients
        evaluate them), or until ``stop_event`` is set."""
        linger = self.cfg.gateway.linger_s
        if self.server is None or not linger or stop_event.is_set():
            return
        print(
            f"gateway serving the trained policies for {linger:g}s more (stop the job to end now)", flush=True
        )
        stop_event.wait(linger)

    def stop(self, external: Any) -> None:
        """Stop the endpoints (calls in flight get their grace period), remove ``gateway.json`` and count the
        reported episodes no update took (:meth:`count_untrained`, from ``external``,
        the job's :class:`~services.trainer.data.external.ExternalEpisodes`). No-op when not
        running."""
        server = self.server
        if server is None:
            return
        try:
            server.stop()
        finally:
            self.count_untrained(self.gateway, external)
            self.gateway = self.backend = self.server = None
            self.address = None
            if self.run_dir is not None:
                (self.run_dir / "gateway.json").unlink(missing_ok=True)

    def count_untrained(self, gateway: Any, external: Any) -> None:
        """Set :attr:`untrained_external` once the gateway is closed, and warn when it is not 0, saying why.

        Args:
            gateway: The closed gateway (None: no counters).
            external: The job's external episodes (None once the job's tables are gone: none left in them).
        """
        st = gateway.stats() if gateway is not None else {}
        lost = int(st.get("backlog_lost_at_close", 0) + st.get("held_lost_at_close", 0))
        if self.cfg.rollout.source == "builtin":
            left = int(st.get("released", 0))
            why = (
                f"{left} released and {lost} held or queued when the gateway closed (gateway/held_lost_at_close, "
                "gateway/backlog_lost_at_close), reported with rollout.source=builtin, which trains on no "
                "reported episode"
            )
        else:
            left = external.untaken() if external is not None else 0
            stale = int(st.get("stale_reported", 0))
            stale_note = (
                f"; {stale} reported episodes were already past the staleness bound when reported "
                "(gateway/stale_reported): an update drops those instead of training on them"
                if stale
                else ""
            )
            why = (
                f"{left} were still in the agents' tables when the job ended (reported after the last update "
                f"took its external.episodes_per_step={self.cfg.external_episodes_per_step}, e.g. during "
                f"gateway.linger_s, or too stale to train on), {lost} were lost as the gateway closed "
                f"(gateway/backlog_lost_at_close, gateway/held_lost_at_close){stale_note}"
            )
        self.untrained_external = left + lost
        if self.untrained_external:
            _LOG.warning("%d reported episodes were never trained: %s", self.untrained_external, why)

    def refresh(self) -> None:
        """Make the actors' new versions servable (and their ``agent@VERSION`` names) and rewrite
        ``gateway.json`` with the models now served; no-op when not running."""
        if self.backend is not None:
            self.backend.refresh()
            if self.gateway is not None and self.address is not None:
                self.address["models"] = [m.id for m in self.gateway.models()]
                self._write_address()

    def _write_address(self) -> None:
        """Write :attr:`address` to ``<run_dir>/gateway.json`` atomically (a reader sees the old file or the new
        one, never a part)."""
        assert self.run_dir is not None
        path = self.run_dir / "gateway.json"
        tmp = path.with_name(".gateway.json.tmp")
        tmp.write_text(json.dumps(self.address, indent=2) + "\n")
        os.replace(tmp, path)

    def stats(self) -> dict[str, float]:
        """The gateway's counters (:meth:`~services.gateway.core.gateway.Gateway.stats`), read on its loop; empty
        when it is not running."""
        gateway, server = self.gateway, self.server
        if gateway is None or server is None or not server.running:
            return {}

        async def read() -> dict[str, float]:
            return gateway.stats()

        return server.run(read())

    def metrics(self) -> dict[str, float]:
        """The counters as step metrics ``gateway/<counter>`` (cumulative over the job): ``calls`` (traced),
        ``untraced_calls``, ``finished``, ``released``, ``abandoned``, ``failed``, ``dropped``,
        ``open_episodes``, ``batches``, ``batched_prompts``, ``sink_errors``, ``backlog`` (released episodes
        waiting to be inserted, now), ``queued_reports``, ``backlog_refused``, ``backlog_lost_at_close``; see
        :meth:`~services.gateway.core.gateway.Gateway.stats`."""
        return {f"gateway/{k}": float(v) for k, v in self.stats().items()}

    def counts(self) -> str:
        """The episode counters in words, for error messages."""
        st = self.stats()
        if not st:
            return "no counters"
        keys = (
            "calls",
            "released",
            "open_episodes",
            "abandoned",
            "failed",
            "dropped",
            "sink_errors",
            "backlog",
        )
        return ", ".join(f"{int(st.get(k, 0))} {k.replace('_', ' ')}" for k in keys)

    def http_address(self) -> str:
        """The HTTP URL while serving, else ``(not running)`` (for error messages)."""
        return self.address["http"] if self.address else "(not running)"
