"""Ray orchestration of the trainer's actors: local ``ray.init`` or an existing cluster, one placement group with
a bundle per actor sized from the config, released when the job ends or fails. A job attaching to an existing
cluster first matches its token authentication (:mod:`services.trainer.ray.auth`).

Policy actors (:class:`~services.trainer.ray.policy_worker.PolicyWorker`): in ``per_agent`` mode one per agent (its
``num_cpus`` / ``num_gpus`` reserved); in ``lora`` and ``shared`` mode one for the team, which keeps a single
copy of the base weights.

Reference models and critics, two layouts (``ray.colocate_models``):

- colocated (``true``, the default): each lives in the policy actor of its agent (the reference is the base
  with adapters disabled in ``lora`` mode, else a frozen copy; one critic per trainable agent with ``gae``).
  No extra actors and, in ``lora`` mode, no extra copy of the base weights: the layout for small machines.
- separate (``false``): one :class:`~services.trainer.ray.model_workers.ReferenceWorker` actor per trainable agent
  when ``algorithm.kl_coef > 0`` and one :class:`~services.trainer.ray.model_workers.CriticWorker` actor per
  trainable agent when the estimator is ``gae``, each on a bundle of its own. :meth:`RayRuntime.train` then
  asks the reference and the critic for their outputs on the batch (in parallel), passes them to the policy
  actor's update, and fits the critic on the returns it reports. The numbers are those of the colocated
  layout: the same weights, seeds, padding, windows and losses.

Every actor is started with :func:`actor_env_vars` in its Ray ``runtime_env``: OpenMP threads that sleep
between kernels instead of spinning, as many as its bundle's whole CPUs (or the driver's ``OMP_NUM_THREADS``:
:func:`actor_threads`), so a job shares a busy machine without being slowed many times over.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from marti.config import TrainConfig
from marti.errors import FailedPreconditionError, InvalidArgumentError, ResourceExhaustedError
from services.trainer.ray.auth import ClusterAuth, prepare_cluster_auth
from services.trainer.ray.init_signals import callers_signal_handlers

if TYPE_CHECKING:
    from services.trainer.data.table_sampler import BatchSummary, SampledIds
    from services.trainer.ray.table_access import StoreAccess

_LOG = logging.getLogger("marti.trainer.ray")


#: Ray system settings of the local Ray a job starts. ``worker_niceness`` 0: Ray starts its worker processes, so
#: every policy, reference, critic and rollout actor, at niceness 15 by default (``RAY_worker_niceness``), which
#: gives them about 1/30 of a normal process's CPU share on a machine where anything else runs: the training
#: actors are the job's work, so they run at the driver's priority (docs/benchmarks.md, "A step on a busy
#: machine"). ``prestart_worker_first_driver`` off: by default the raylet starts one idle default worker per CPU
#: for the first driver, and none of them is ever used, since every actor a job starts has its own ``runtime_env``
#: (:func:`actor_env_vars`) and so its own worker process; each cost about 0.4 s of CPU and its memory at every job
#: start (2026-12-06, 2 CPUs: 2 idle workers, 0.8 s of the 4.1 s of CPU Ray's processes used in its first 3 s).
LOCAL_RAY_SYSTEM_CONFIG: dict[str, Any] = {"worker_niceness": 0, "prestart_worker_first_driver": False}


def cluster_address(cfg: TrainConfig) -> str | None:
    """The address of the existing Ray cluster the job attaches to: ``ray.address``, or ``RAY_ADDRESS`` when it is
    null; ``None`` when that is null, empty or ``local`` (the job starts a local Ray)."""
    address = cfg.ray.address or os.environ.get("RAY_ADDRESS")
    return None if address in (None, "", "local") else address


def ray_init_kwargs(cfg: TrainConfig) -> dict[str, Any]:
    """The keyword arguments :meth:`RayRuntime.start` passes to ``ray.init`` (when Ray is not running yet).

    ``ray.address`` (or ``RAY_ADDRESS`` when it is null) null, empty or ``local``: a local Ray with ``ray.num_cpus``
    CPUs (all of the machine's when null) and an object store of ``ray.object_store_memory`` bytes (Ray's default
    when null), whose workers run at the driver's own scheduling priority (:data:`LOCAL_RAY_SYSTEM_CONFIG`);
    anything else: attach to that cluster (its own settings apply).
    """
    address = cluster_address(cfg)
    if address is None:
        return {
            "num_cpus": cfg.ray.num_cpus or os.cpu_count(),
            "object_store_memory": cfg.ray.object_store_memory,
            "include_dashboard": False,
            "log_to_driver": True,
            "configure_logging": True,
            "logging_level": logging.WARNING,
            "_system_config": dict(LOCAL_RAY_SYSTEM_CONFIG),
        }
    return {"address": address, "log_to_driver": True, "logging_level": logging.WARNING}


#: Environment variables every trainer actor starts with (unless the driver's environment sets them): how the
#: OpenMP runtime behind torch's CPU kernels (libgomp; Intel's for MKL) waits between parallel regions, and the
#: tokenizers' own thread pool. ``PASSIVE`` / a block time of 0: a thread that finished its share of a kernel
#: sleeps instead of spinning on the core. By default libgomp spins a while after every region, which on a busy
#: machine (more runnable threads than cores) burns the time slice the other thread of the same kernel needs to
#: finish, so each of the many small kernels of a decode step waits for the scheduler (docs/benchmarks.md, "A step
#: on a busy machine": 2 threads on SmolLM2-135M, spinning, were 3-6x slower than sleeping).
#: They are read when the runtime loads, so they must be in the process's environment from its start: Ray's
#: ``runtime_env``.
ACTOR_ENV_VARS: dict[str, str] = {
    "OMP_WAIT_POLICY": "PASSIVE",
    "KMP_BLOCKTIME": "0",
    "TOKENIZERS_PARALLELISM": "false",
}

#: libgomp's spin count before a thread sleeps, set beside ``OMP_WAIT_POLICY=PASSIVE`` (an explicit count wins over
#: the policy's 0): a short spin, about 30 microseconds (libgomp's estimate is 100,000 spins a millisecond), covers
#: the gaps between the small kernels of a decode step on idle cores without burning a busy core's time slice.
#: Measured with ``marti bench trainer`` (our side, SmolLM2-135M LoRA, 2 threads) and the demo job
#: (docs/benchmarks.md, "where the time goes, per thread"; median steps): idle, 2.24 s a step against 3.18 s
#: sleeping at once (1.61 s with libgomp's default 300,000); beside two busy-looping processes, 4.14 s against
#: 4.11 s (8.49 s at 30,000); the demo's job, idle, 12-15% less a step. Added only when the driver's environment
#: sets neither it nor ``OMP_WAIT_POLICY``.
GOMP_SPIN_COUNT = "3000"


def actor_env_vars(num_threads: int, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment variables a trainer actor is started with (Ray ``runtime_env={"env_vars": ...}``).

    :data:`ACTOR_ENV_VARS` plus ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS`` set to the actor's torch intra-op
    threads and ``GOMP_SPINCOUNT`` (:data:`GOMP_SPIN_COUNT`, only where ``OMP_WAIT_POLICY`` is not set), each
    only where ``environ`` (the driver's environment, which Ray's local workers inherit) does not set it already:
    a user's explicit setting wins.

    Args:
        num_threads: The actor's torch intra-op threads (:func:`actor_threads`).
        environ: The environment to respect; ``None``: ``os.environ``.
    """
    environ = os.environ if environ is None else environ
    wanted = {
        **ACTOR_ENV_VARS,
        "OMP_NUM_THREADS": str(num_threads),
        "MKL_NUM_THREADS": str(num_threads),
    }
    if "OMP_WAIT_POLICY" not in environ:  # a user's own wait policy is not overridden by a spin count
        wanted["GOMP_SPINCOUNT"] = GOMP_SPIN_COUNT
    return {k: v for k, v in wanted.items() if k not in environ}


@contextlib.contextmanager
def ray_processes_in_own_session() -> Iterator[bool]:
    """While open, the processes a local ``ray.init`` starts (GCS, raylet, dashboard, log and autoscaler monitors)
    start each in a session, so a process group, of its own; the raylet starts the workers and agents in its own.

    A signal to the whole process group of ``marti train`` (``timeout``'s SIGTERM, ``kill -TERM -PGID``) then
    reaches the driver alone, which stops after its step and shuts Ray down itself
    (:meth:`RayRuntime.shutdown`). In the driver's group they got the SIGTERM too and died, and the job failed a
    minute later (Ray's GCS reconnect timeout) without its report. Ctrl-C is unchanged: Ray's processes block
    SIGINT anyway.

    Only where Ray has the kernel kill them when the driver dies (Linux ``PR_SET_PDEATHSIG``, Ray's fate sharing):
    elsewhere Ray's reaper kills the driver's process group, which they must stay in, so nothing changes there.
    A SIGKILL to the group (``timeout -k``'s last resort) then reaches only the driver; seen once here, not checked
    by a test: its GCS and raylet died with it, the workers at once, and Ray's dashboard and runtime-env agents
    about a minute later (they exit by themselves once the raylet is gone, after a GCS timeout).

    Ray starts them through ``ray._private.services.ConsolePopen`` (a ``subprocess.Popen``); this swaps in a
    subclass with ``start_new_session=True`` for the duration, and puts the original back on exit.

    Yields:
        Whether Ray's processes start in their own session (False: not Linux, no fate sharing, or a Ray without
        ``ConsolePopen``; logged as a warning in the last case).
    """
    from ray._private import services, utils

    base = getattr(services, "ConsolePopen", None)
    if not sys.platform.startswith("linux") or not utils.detect_fate_sharing_support() or base is None:
        if base is None:
            _LOG.warning("this Ray has no ConsolePopen: its processes stay in the job's process group")
        yield False
        return

    class OwnSessionPopen(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["start_new_session"] = True
            super().__init__(*args, **kwargs)

    services.ConsolePopen = OwnSessionPopen
    try:
        yield True
    finally:
        services.ConsolePopen = base


def actor_threads(bundle_cpus: float, environ: Mapping[str, str] | None = None) -> int:
    """torch intra-op threads of an actor whose bundle holds ``bundle_cpus`` CPUs.

    The driver environment's ``OMP_NUM_THREADS`` when it is a positive integer (for OpenMP's comma list of nested
    levels, its first entry): a user's explicit setting wins, as in :func:`actor_env_vars`, and the actor's
    ``torch.set_num_threads`` applies it. Otherwise the bundle's whole CPUs, at least 1; a
    value that is not a positive integer is logged and left to that default.

    Args:
        bundle_cpus: CPUs of the actor's placement-group bundle.
        environ: The environment to read; ``None``: ``os.environ``.
    """
    environ = os.environ if environ is None else environ
    setting = environ.get("OMP_NUM_THREADS", "")
    if setting.strip():
        first = setting.split(",")[0].strip()
        if first.isdigit() and int(first) > 0:
            return int(first)
        _LOG.warning(
            "OMP_NUM_THREADS=%r is not a positive integer: each actor uses its bundle's whole CPUs", setting
        )
    return max(1, int(bundle_cpus))


@dataclass(frozen=True)
class ActorSpec:
    """One actor of a job's layout (see :meth:`RayRuntime.actors`).

    Attributes:
        name: ``policy_worker`` (one team actor) or ``policy_worker_<i>``, ``reference_<agent>``,
            ``critic_<agent>``, ``rollout_worker_<i>``, ``reward_model``; the key in
            :attr:`RayRuntime.worker_pids`.
        kind: ``policy``, ``reference``, ``critic``, ``rollout`` or ``reward`` (the reward model).
        agents: The agents it serves (one for references and critics).
        group: The agents of the policy actor holding them; ``None`` = the whole team (one policy actor).
    """

    name: str
    kind: Literal["policy", "reference", "critic", "rollout", "reward"]
    agents: tuple[str, ...]
    group: tuple[str, ...] | None


class RayRuntime:
    """Owns the Ray connection, the placement group and the actors of one job.

    Actor groups: in ``per_agent`` mode every agent gets its own policy actor (its model and optimizer, and
    when colocated its reference and critic) with its own bundle (``num_cpus`` / ``num_gpus`` of the agent, at
    least ``ray.num_cpus_per_worker``); in ``lora`` and ``shared`` mode the team shares one actor, which holds
    the single copy of the base weights. With ``ray.colocate_models: false`` every trainable agent also gets a
    reference actor (``kl_coef > 0``) and a critic actor (``gae``), on bundles sized like its policy's. Calls
    are routed to the actor that holds the agent.

    Args:
        cfg: The training config (``ray`` section: address, CPUs, object store, layout; agents' resources).
    """

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self._started_ray = False
        self._auth: ClusterAuth | None = None
        self._pg = None
        self._workers: list[Any] = []
        self._owner: dict[str, Any] = {}
        self._references: dict[str, Any] = {}
        self._critics: dict[str, Any] = {}
        self._rollout: list[Any] = []
        self._reward: Any = None  # the reward-model actor (reward.model), when there is one
        self._actors: list[Any] = []
        # A generate call split across rollout actors and a weight sync to them exclude each other, so every
        # chunk of one call samples with one policy version (a GRPO group's members then share versions and
        # are kept or dropped together by the staleness bound).
        self._rollout_lock = threading.Lock()
        self._serve_lock = threading.Lock()  # the rollout actor that serves the next gateway call
        self._serve_next = -1
        self.worker_pids: dict[str, int] = {}
        """Process id of every actor by :attr:`ActorSpec.name` (``policy_worker`` or ``policy_worker_<i>``,
        ``reference_<agent>``, ``critic_<agent>``), for monitoring."""
        self.actor_info: dict[str, dict[str, Any]] = {}
        """What every actor's ``ping`` answered when it was ready, by :attr:`ActorSpec.name`: its ``pid``,
        ``device`` and ``torch_threads`` (intra-op threads, :func:`actor_threads`), with its kind's own keys."""

    def groups(self) -> list[list[str]]:
        """Agent names per policy actor: one per agent in ``per_agent`` mode, else the whole team in one."""
        names = [a.name for a in self.cfg.agents]
        return [[n] for n in names] if self.cfg.policy_mode == "per_agent" else [names]

    def actors(self) -> list[ActorSpec]:
        """Every actor of the job: the policy actors, then (``ray.colocate_models: false``) per trainable agent
        its reference actor (``algorithm.kl_coef > 0``) and its critic actor (``gae``), then the
        ``ray.num_rollout_workers`` rollout actors (:mod:`services.trainer.ray.rollout_worker`), then with
        ``reward.model`` the reward-model actor (:mod:`services.trainer.ray.reward_worker`)."""
        groups = self.groups()
        specs = []
        for i, g in enumerate(groups):
            name, group = ("policy_worker", None) if len(groups) == 1 else (f"policy_worker_{i}", tuple(g))
            specs.append(ActorSpec(name, "policy", tuple(g), group))
        team = tuple(a.name for a in self.cfg.agents)
        rollout = [
            ActorSpec(f"rollout_worker_{i}", "rollout", team, None)
            for i in range(self.cfg.ray.num_rollout_workers)
        ]
        if self.cfg.reward.model:
            rollout.append(ActorSpec("reward_model", "reward", (), None))
        if self.cfg.ray.colocate_models:
            return specs + rollout
        kinds: list[Literal["reference", "critic"]] = []
        if self.cfg.algorithm.kl_coef > 0:
            kinds.append("reference")
        if self.cfg.algorithm.advantage_estimator == "gae":
            kinds.append("critic")
        for policy in list(specs):
            for agent in policy.agents:
                if self.cfg.agent(agent).is_tuning:
                    specs += [ActorSpec(f"{k}_{agent}", k, (agent,), policy.group) for k in kinds]
        return specs + rollout

    def _bundles(self, actors: list[ActorSpec], available: dict[str, float]) -> list[dict[str, float]]:
        """One bundle per actor: the CPUs and GPUs its agents ask for, CPUs shared out when short.

        An actor wants ``max(ray.num_cpus_per_worker, its agents' num_cpus)`` CPUs, capped at an equal share
        of the CPUs Ray has (fractional, rounded down to 0.01, so six actors still fit on 2 CPUs), and
        ``max(ray.num_gpus_per_worker, its agents' num_gpus)`` GPUs when the device is not ``cpu`` and Ray has
        the GPUs for every actor. A rollout actor and the reward-model actor want ``ray.num_cpus_per_worker`` and
        ``ray.num_gpus_per_worker``.

        Raises:
            ResourceExhaustedError: ``device: cuda`` and the actors ask for more GPUs than Ray has (``auto``
                falls back to the CPU with a warning).
        """
        cpu_total = available.get("CPU", 1.0)
        share = cpu_total / len(actors)
        wants = []
        for spec in actors:
            agents = [self.cfg.agent(n) for n in spec.agents] if spec.kind != "rollout" else []
            cpus = max(float(self.cfg.ray.num_cpus_per_worker), *(a.num_cpus for a in agents), 0.0)
            gpus = max(float(self.cfg.ray.num_gpus_per_worker), *(a.num_gpus for a in agents), 0.0)
            wants.append((cpus, gpus))
        need, have = sum(g for _, g in wants), available.get("GPU", 0.0)
        use_gpus = self.cfg.device != "cpu" and have >= need
        if self.cfg.device == "cuda" and need > have:
            raise ResourceExhaustedError(
                f"device=cuda: the {len(actors)} actors ask for {need:g} GPUs (agents' num_gpus, "
                f"ray.num_gpus_per_worker per actor, ray.num_rollout_workers), Ray has {have:g}"
            )
        if self.cfg.device == "auto" and 0 < have < need:
            _LOG.warning("the actors ask for %g GPUs and Ray has %g: every actor runs on the CPU", need, have)
        bundles = []
        for cpus, gpus in wants:
            bundle = {"CPU": max(0.01, math.floor(min(cpus, share) * 100) / 100)}
            if gpus and use_gpus:
                bundle["GPU"] = gpus
            bundles.append(bundle)
        return bundles

    def max_concurrency(self, kind: str) -> int:
        """Calls an actor of ``kind`` runs at once (Ray threads; its engine lock orders the engine calls).

        A policy actor runs its ``train`` plus, when it generates (no rollout actors), the asynchronous
        rollouts' ``generate`` (``rollout.max_staleness > 0``) and the inference gateway's ``serve``
        (``gateway.enabled``), so a gateway call never waits for an update or a rollout to end. A rollout
        actor runs ``generate`` and ``update_weights``, plus ``serve`` with the gateway.
        """
        gateway = self.cfg.gateway.enabled
        if kind == "policy":
            if self.cfg.ray.num_rollout_workers:
                return 1
            return 1 + int(self.cfg.rollout.max_staleness > 0) + int(gateway)
        if kind == "rollout":
            return 1 + int(gateway)
        return 1

    def start(self, timeout_s: float = 600.0) -> None:
        """Connect to (or start) Ray, reserve the placement group and start the actors (:meth:`actors`).

        Attaching to an existing cluster (:func:`cluster_address`), the driver first matches the cluster's token
        authentication (:func:`~services.trainer.ray.auth.prepare_cluster_auth`: token mode with the token from
        ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token`` when the cluster requires one);
        :meth:`shutdown` puts ``RAY_AUTH_MODE`` back.

        Raises:
            ResourceExhaustedError: the placement group could not be reserved within ``timeout_s``.
            NotFoundError: a model is not available locally (raised by the worker, named).
            UnauthenticatedError: the cluster requires a token and none is found, or the one found is refused
                (the message names the fix).
            FailedPreconditionError: ``RAY_AUTH_MODE=token`` is set and the cluster does not use tokens.
        """
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from services.trainer.ray.model_workers import (
            CriticWorker,
            ReferenceWorker,
            critic_actor_config,
            reference_actor_config,
        )
        from services.trainer.ray.policy_worker import PolicyWorker, policy_actor_config
        from services.trainer.ray.reward_worker import RewardModelWorker, reward_actor_config
        from services.trainer.ray.rollout_worker import RolloutWorker, rollout_actor_config

        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        # ray.init sets its own SIGTERM handler (exit at once) as it begins: keep the caller's throughout
        # (marti train stops after the current step and shuts the stack down cleanly; init_signals.py).
        if not ray.is_initialized():
            address = cluster_address(self.cfg)
            if address is not None:  # match the cluster's token authentication (services.trainer.ray.auth)
                self._auth = prepare_cluster_auth(address)
            else:  # a later job of this process (marti trainer runs several) attaching to a cluster without
                # tokens would fail in the token mode a local ray.init leaves behind: shutdown puts it back
                self._auth = ClusterAuth.before_local_init()
            try:
                with callers_signal_handlers(), ray_processes_in_own_session():
                    ray.init(**ray_init_kwargs(self.cfg))
            except BaseException:
                self._restore_auth()
                raise
            self._started_ray = True
        specs = self.actors()
        bundles = self._bundles(specs, ray.available_resources())
        self._pg = placement_group(bundles, strategy="PACK")
        ready, _ = ray.wait([self._pg.ready()], timeout=timeout_s)
        if not ready:
            ray.util.remove_placement_group(self._pg)
            self._pg = None
            raise ResourceExhaustedError(f"could not reserve Ray resources {bundles} within {timeout_s:.0f}s")
        # The config was validated once, on the driver; each actor gets a narrow frozen config of its part.
        classes = {
            "policy": PolicyWorker,
            "reference": ReferenceWorker,
            "critic": CriticWorker,
            "rollout": RolloutWorker,
            "reward": RewardModelWorker,
        }
        for i, (spec, bundle) in enumerate(zip(specs, bundles, strict=True)):
            threads = actor_threads(bundle["CPU"])
            actor = ray.remote(classes[spec.kind]).options(
                num_cpus=bundle["CPU"],
                runtime_env={"env_vars": actor_env_vars(threads)},
                num_gpus=bundle.get("GPU", 0),
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self._pg, placement_group_bundle_index=i
                ),
                max_concurrency=self.max_concurrency(spec.kind),
            )
            group = None if spec.group is None else list(spec.group)
            if spec.kind == "policy":
                handle = actor.remote(policy_actor_config(self.cfg, group), num_threads=threads)
                self._workers.append(handle)
                self._owner.update({name: handle for name in spec.agents})
            elif spec.kind == "rollout":
                narrow = rollout_actor_config(self.cfg)
                handle = actor.remote(narrow, index=len(self._rollout), num_threads=threads)
                self._rollout.append(handle)
            elif spec.kind == "reward":
                handle = self._reward = actor.remote(reward_actor_config(self.cfg), num_threads=threads)
            elif spec.kind == "reference":
                narrow = reference_actor_config(self.cfg, spec.agents[0], group)
                handle = actor.remote(narrow, num_threads=threads)
                self._references[spec.agents[0]] = handle
            else:
                narrow = critic_actor_config(self.cfg, spec.agents[0], group)
                handle = actor.remote(narrow, num_threads=threads)
                self._critics[spec.agents[0]] = handle
            self._actors.append(handle)
        infos = self._get([a.ping.remote() for a in self._actors])
        for spec, info in zip(specs, infos, strict=True):
            _LOG.info("%s ready: %s", spec.name, info)
            self.worker_pids[spec.name] = int(info["pid"])
            self.actor_info[spec.name] = info
        self._sync_rollout_workers([a.name for a in self.cfg.agents])

    def _sync_rollout_workers(self, agents: list[str]) -> None:
        """Send each agent's current weights and version from its policy actor to every rollout actor, and wait
        until all have them (a rollout actor applies a sync between two generate calls)."""
        if not self._rollout:
            return
        fetched = [
            (agent, *self._owner[agent].weights_for_sync.options(num_returns=2).remote(agent))
            for agent in agents
        ]
        with self._rollout_lock:  # submitted and applied between two generate calls, on every rollout actor
            calls = [
                w.update_weights.remote(agent, weights, version)
                for agent, weights, version in fetched
                for w in self._rollout
            ]
            self._get(calls)

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
            raise RuntimeError(f"trainer actor died: {init_error}") from None

    def generate(
        self,
        agent: str,
        chats: list[list[dict[str, str]]],
        greedy: bool = False,
        reply_starts: list[str] | None = None,
    ) -> list[Any]:
        """Generate on the agent's policy actor (see :meth:`PolicyWorker.generate`) or, with rollout actors,
        split the chats (and their ``reply_starts``, one per chat, or None) into contiguous chunks across them
        and join the answers in order (never across a weight sync: every chunk samples with the same policy
        version). A too-long prompt's error names its position in ``chats``
        (:func:`~services.trainer.rollout.engines.base.shifted`)."""
        from services.trainer.rollout.engines.base import shifted

        if not self._rollout:
            try:
                return self._get(self._owner[agent].generate.remote(agent, chats, greedy, reply_starts))
            except InvalidArgumentError as exc:  # a too-long prompt: its message without Ray's traceback
                raise shifted(exc, 0) from None
        n = len(self._rollout)
        bounds = [len(chats) * i // n for i in range(n + 1)]
        with self._rollout_lock:
            calls = [
                (
                    lo,
                    w.generate.remote(
                        agent, chats[lo:hi], greedy, None if reply_starts is None else reply_starts[lo:hi]
                    ),
                )
                for w, lo, hi in zip(self._rollout, bounds, bounds[1:], strict=False)
                if hi > lo
            ]
            out: list[Any] = []
            for lo, call in calls:  # in order: a too-long prompt's error names its position in ``chats``
                try:
                    out += self._get(call)
                except InvalidArgumentError as exc:
                    raise shifted(exc, lo) from None
            return out

    def _serving_actor(self, agent: str) -> Any:
        """The actor that serves the gateway's calls of ``agent``: its policy actor, or the next rollout actor
        (round robin) when there are rollout actors."""
        if not self._rollout:
            if agent not in self._owner:
                from marti.errors import NotFoundError

                raise NotFoundError(f"unknown agent {agent!r}; agents are {sorted(self._owner)}")
            return self._owner[agent]
        with self._serve_lock:
            self._serve_next = (self._serve_next + 1) % len(self._rollout)
            return self._rollout[self._serve_next]

    def serve(
        self, agent: str, prompts: list[list[int]], sampling: Any, version: int | None = None
    ) -> list[Any]:
        """An inference-gateway call on the agent's serving actor (:meth:`PolicyWorker.serve` or
        :meth:`RolloutWorker.serve`): one generation per prompt of token ids with the caller's sampling
        parameters (:class:`marti.types.inference.SamplingParams`), on the current or a resident ``version``.

        Safe to call from any thread while the loop generates or trains: the actor runs it on a thread of its
        own (:meth:`max_concurrency`) under its engine lock.

        Raises:
            NotFoundError: Unknown agent, or ``version`` not resident.
            InvalidArgumentError: A prompt plus ``max_new_tokens`` beyond the model's length.
            The actor's own exception, unwrapped from Ray's (so its message is the actor's).
        """
        import ray

        actor = self._serving_actor(agent)
        try:
            return ray.get(actor.serve.remote(agent, [list(p) for p in prompts], sampling, version))
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, Exception):
                raise cause from None
            raise exc.as_instanceof_cause() from None
        except ray.exceptions.ActorDiedError as exc:
            raise RuntimeError(f"the actor serving {agent!r} died: {exc}") from None

    def serving_state(self) -> dict[str, dict[str, Any]]:
        """What the serving actors report (see :meth:`PolicyWorker.serving_state`), merged over every agent:
        ``{"versions": {agent: v}, "resident": {agent: [v, ...]}, "max_model_len": {agent: n}}``."""
        actors = self._rollout[:1] if self._rollout else self._workers
        out: dict[str, dict[str, Any]] = {"versions": {}, "resident": {}, "max_model_len": {}}
        for part in self._get([a.serving_state.remote() for a in actors]):
            for key, values in part.items():
                out[key].update(values)
        return out

    def train(self, agent: str, trajectories: list[Any]) -> dict[str, float]:
        """One RL step of ``agent`` (see :meth:`PolicyWorker.train`), on whichever layout the job has; with
        rollout actors the new weights are then synced to them (before this returns).

        Colocated: one call to the policy actor. Separate actors: the reference log-probabilities and the
        critic's values of the batch are computed in parallel, the policy actor updates with them, then the
        critic actor fits the returns the update reports; its ``value_loss``, ``vf_clip_frac`` and
        ``value_mean`` join the policy's statistics (Ray passes the tensors between actors; the driver only
        waits for the statistics).

        Raises:
            FloatingPointError: a non-finite policy or value loss (the actor's own exception type).
            FailedPreconditionError: the trajectories cannot be collated (no turn to train on).
        """
        stats = self._update(agent, trajectories)
        self._sync_rollout_workers([agent])
        return stats

    def take_items(
        self, agent: str, table: str, count: int, current_version: int, access: StoreAccess
    ) -> SampledIds | None:
        """One sample call of ``agent``'s take, on its policy actor (see
        :meth:`~services.trainer.ray.table_access.TableTaking.take_items`): the actor keeps the trajectories,
        the driver gets their episode ids.

        Raises:
            UnavailableError: the store cannot be reached (the actor's own exception type: the caller
                reconnects).
        """
        return self._get(self._owner[agent].take_items.remote(agent, table, count, current_version, access))

    def batch_summary(self, agent: str, current_version: int) -> BatchSummary:
        """Close ``agent``'s take on its policy actor and answer the batch's figures
        (:meth:`~services.trainer.data.table_sampler.TableSampler.summary`)."""
        return self._get(self._owner[agent].batch_summary.remote(agent, current_version))

    def train_taken(self, agent: str, keep: list[int] | None = None) -> dict[str, float]:
        """:meth:`train` on the batch ``agent``'s policy actor took itself (its last summarised take; ``keep``:
        the indices of its trained rows to train on, None = all). The trajectories go from the policy actor to
        the update (and to separate reference and critic actors) by reference; the driver only waits for the
        statistics.

        Raises:
            FailedPreconditionError: no batch is waiting, ``keep`` is out of range, or nothing can be collated.
            FloatingPointError: a non-finite policy or value loss.
        """
        stats = self._update(agent, self._owner[agent].pop_taken.remote(agent, keep))
        self._sync_rollout_workers([agent])
        return stats

    def _update(self, agent: str, trajectories: Any) -> dict[str, float]:
        """The update of :meth:`train` on the policy actor (and the reference and critic actors);
        ``trajectories``: a list, or an ObjectRef of one (passed on, never fetched here)."""
        policy = self._owner[agent]
        reference, critic = self._references.get(agent), self._critics.get(agent)
        if reference is None and critic is None:
            return self._get(policy.train.remote(agent, trajectories))
        import ray

        data = trajectories if isinstance(trajectories, ray.ObjectRef) else ray.put(trajectories)
        ref_lp = None if reference is None else reference.ref_logprobs.remote(data)
        if critic is None:
            return self._get(policy.train.remote(agent, data, ref_lp))
        values = critic.values.remote(data)
        stats, returns = policy.train.options(num_returns=2).remote(agent, data, ref_lp, values, True)
        stats, value_stats = self._get([stats, critic.fit.remote(data, values, returns)])
        return {**stats, **value_stats}

    def score_rewards(
        self, prompts: list[str], completions: list[str], columns: dict[str, list[Any]]
    ) -> list[float]:
        """Score completions on the reward-model actor (``reward.model``; see
        :meth:`services.trainer.ray.reward_worker.RewardModelWorker.score`).

        Raises:
            FailedPreconditionError: The job has no reward model.
        """
        if self._reward is None:
            raise FailedPreconditionError("this job has no reward model (reward.model)")
        return self._get(self._reward.score.remote(prompts, completions, columns))

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
        """Checkpoint every policy actor (see :meth:`PolicyWorker.save`), critic actor and rollout actor (its
        sampler state, ``rollout_worker_<i>.pt``).

        Per-agent policy actors save under ``worker_<i>``; critic actors under ``critic_<agent>`` (weights,
        optimizer, scheduler, counters, RNG: an exact resume). Reference actors hold only base weights.
        """
        paths = self._paths(path)
        calls = [w.save.remote(p, data_position) for w, p in zip(self._workers, paths, strict=True)]
        calls += [c.save.remote(str(Path(path) / f"critic_{a}")) for a, c in self._critics.items()]
        calls += [
            w.save.remote(str(Path(path) / f"rollout_worker_{i}.pt")) for i, w in enumerate(self._rollout)
        ]
        self._get(calls)
        return path

    def load(self, path: str) -> dict[str, Any]:
        """Restore every policy and critic actor from :meth:`save`, and the rollout actors' sampler states where
        saved, then sync every agent's weights to the rollout actors; returns the saved data position.

        Raises:
            NotFoundError: a checkpoint file is missing.
        """
        paths = self._paths(path)
        calls = [w.load.remote(p) for w, p in zip(self._workers, paths, strict=True)]
        calls += [c.load.remote(str(Path(path) / f"critic_{a}")) for a, c in self._critics.items()]
        n_trainers = len(calls)  # policy and critic actors; the rollout actors answer True or False
        calls += [
            w.load.remote(str(Path(path) / f"rollout_worker_{i}.pt")) for i, w in enumerate(self._rollout)
        ]
        positions = self._get(calls)[:n_trainers]
        self._sync_rollout_workers([a.name for a in self.cfg.agents])
        return positions[0]

    def shutdown(self) -> None:
        """Kill every actor, release the placement group, and stop Ray if this runtime started it (then put back
        ``RAY_AUTH_MODE`` as it was before :meth:`start`: set for a cluster by it, or by a local ``ray.init``)."""
        import ray

        try:
            if not ray.is_initialized():
                return
            for actor in self._actors:
                ray.kill(actor)
            for held in (
                self._actors,
                self._workers,
                self._owner,
                self._references,
                self._critics,
                self._rollout,
            ):
                held.clear()
            if self._pg is not None:
                ray.util.remove_placement_group(self._pg)
                self._pg = None
            if self._started_ray:
                ray.shutdown()
                self._started_ray = False
        finally:  # also when the teardown fails (a cluster gone mid-job): the next job must not inherit the mode
            self._restore_auth()

    def _restore_auth(self) -> None:
        """Undo what :func:`~services.trainer.ray.auth.prepare_cluster_auth` set (``RAY_AUTH_MODE``)."""
        if self._auth is not None:
            self._auth.restore()
            self._auth = None
