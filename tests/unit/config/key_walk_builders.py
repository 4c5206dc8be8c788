"""The builders of the key walk (tests/unit/config/test_key_walk.py): each runs the trainer's own code on a config
and returns, as text, what that code built or did (never the raw config); :data:`BUILDERS` names them."""

from __future__ import annotations

import argparse
import contextlib
import importlib.machinery
import io
import json
import os
import sys
import tempfile
import time
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import marti
from marti.config import TrainConfig


def _loop(cfg: TrainConfig) -> Any:
    """The training loop of ``cfg``, against service addresses it never dials."""
    from services.trainer.job.connections.addresses import Addresses
    from services.trainer.job.run.loop import TrainingLoop

    return TrainingLoop(cfg, Addresses("unused:1", "unused:1", "unused:1"), show_progress=False)


def _runtime(cfg: TrainConfig) -> Any:
    """What the loop asks a runtime for before it generates: every agent's version."""
    return SimpleNamespace(versions=lambda: {a.name: 0 for a in cfg.agents})


# ---------------------------------------------------------------------------------------------- builders
def _learner(cfg: TrainConfig) -> str:
    """What the config-consuming learner builders produce: algorithm settings, policy layout, train engine
    settings, engine counts and sampling parameters."""
    import torch

    from services.trainer.ray.policy_worker import build_strategy, learner_config, policy_layout
    from services.trainer.rollout.engines.generation import engine_count, sampling_params
    from services.trainer.rollout.engines.vllm_engine import engine_settings

    lin = torch.nn.Linear(1, 1)
    first = cfg.agents[0].name
    # The optimizer settings do not depend on strategy.name; torch builds them without starting DeepSpeed.
    cfg_t = cfg.model_copy(update={"strategy": cfg.strategy.model_copy(update={"name": "torch"})})
    optim = build_strategy(
        cfg_t, first, lin, list(lin.parameters())
    ).cfg  # schedule length: ppo_epochs, total_steps
    critic_optim = build_strategy(
        cfg_t, first, lin, list(lin.parameters()), lr=cfg.algorithm.critic_learning_rate
    ).cfg

    parts: list[Any] = [
        # the policy update's settings: the algorithm section (every key of it reaches update_agent and its named
        # consumers, checked in tests/unit/trainer/learn/test_algo_config_mapping.py) and the update's hyper-parameters
        learner_config(cfg),
        optim,
        critic_optim,
        policy_layout(cfg),
        engine_count(cfg, "vllm"),
        engine_settings(cfg.vllm),  # the vLLM engine's kwargs (VLLMRolloutEngine.from_policy)
        [sampling_params(cfg, a.name) for a in cfg.agents],
    ]
    return repr(parts)


def _engine(cfg: TrainConfig) -> str:
    """The rollout engines ``build_rollout_engine`` builds on a CPU and on a CUDA actor (vLLM taken as not
    installed, so the answer does not depend on the machine); the engines' constructors are recorded."""
    from services.trainer.rollout.engines import generation
    from services.trainer.rollout.engines.hf import HFRolloutEngine
    from services.trainer.rollout.engines.vllm_engine import VLLMRolloutEngine

    built: list[Any] = []
    engine = SimpleNamespace(update_weights=lambda *args: None)

    def hf(policy: Any, **kwargs: Any) -> Any:
        built.append(("hf", kwargs))
        return engine

    def vllm(policy: Any, settings: Any, agents: Any, **kwargs: Any) -> Any:
        built.append(("vllm", settings, agents, kwargs))
        return engine

    policy = SimpleNamespace(state_for_sync=lambda agent: {}, version=lambda agent: 0)
    with (
        mock.patch.object(HFRolloutEngine, "from_policy", hf),
        mock.patch.object(VLLMRolloutEngine, "from_policy", vllm),
        mock.patch.object(generation, "vllm_available", lambda: False),
    ):
        for device in ("cpu", "cuda"):
            generation.build_rollout_engine(
                generation.generation_config(cfg),
                policy,
                [a.name for a in cfg.agents],
                device,
                copy_weights=False,
            )
    return repr(built)


def _placement(cfg: TrainConfig) -> str:
    """The job's Ray actors, their bundles on a 64-CPU / 64-GPU cluster, their concurrency, the ``ray.init``
    kwargs (``RAY_ADDRESS`` unset) and the device the actors resolve."""
    from services.trainer.ray.actor_setup import resolve_device
    from services.trainer.ray.runtime import RayRuntime, ray_init_kwargs

    runtime = RayRuntime(cfg)
    specs = runtime.actors()
    with mock.patch.dict(os.environ):
        os.environ.pop("RAY_ADDRESS", None)
        init = ray_init_kwargs(cfg)
    return repr(
        [
            specs,
            runtime._bundles(specs, {"CPU": 64.0, "GPU": 64.0}),
            {kind: runtime.max_concurrency(kind) for kind in ("policy", "rollout", "reference", "critic")},
            init,
            resolve_device(cfg),
        ]
    )


def _env(cfg: TrainConfig) -> str:
    """The env name and config the loop builds each episode's env with (``_env_for`` recorded, not dialled):
    the single env, every task's env, and an env return scaled by ``reward_alloc``."""
    from services.trainer.rollout.episodes.env_config import agent_return

    loop = _loop(cfg)
    made: list[Any] = []
    loop._env_for = lambda name, seed, config: made.append((name, seed, config))
    loop._make_env(7)
    for task in cfg.tasks:
        loop._make_task_env(7, task.name)
    return repr([made, agent_return(cfg, 1.0)])


def _services(cfg: TrainConfig) -> str:
    """What ``marti train`` connects to (no address flags): the addresses and token, the embedded stack it
    would start (recorded), and the loop's reconnect backoff."""
    from services.trainer.job.cli.train_cli import service_addresses
    from services.trainer.job.run import loop as loop_mod

    stacks: list[dict[str, Any]] = []

    class Stack:
        def __init__(self, **kwargs: Any) -> None:
            self.kwargs = kwargs
            stacks.append(kwargs)

        def start(self) -> dict[str, str]:
            return {name: f"embedded-{name}:1" for name in self.kwargs["services"]}

        def stop(self) -> None:
            pass

    args = argparse.Namespace(broker=None, env=None, store=None, token=None)
    with mock.patch("marti.command.stack.LocalStack", Stack), contextlib.redirect_stdout(io.StringIO()):
        with service_addresses(cfg, args) as addresses:
            pass
    loop = _loop(cfg)
    with mock.patch.object(
        loop_mod, "call_with_reconnect", lambda fn, what, backoff, on_retry, stop=None: backoff
    ):
        backoff = loop._reconnecting(lambda: None, "probe")
    used = [addresses.broker, addresses.env, addresses.store, addresses.token]
    used.append({s: addresses.ca_for(s) for s in ("broker", "env", "store")})  # the CA each channel uses
    return repr([used, stacks, backoff])


def _episodes(cfg: TrainConfig) -> str:
    """What the loop plays (``_play`` recorded): the seeds and tasks of six training steps and an evaluation,
    its run directory, and the episode runner it builds: run id, roles, each agent's chat prompt, the speakers of
    six turns, parsed and scripted replies, and the rewards credited for a fixed episode."""
    from marti.team.workflow import EpisodeView, WorkflowState
    from services.trainer.rollout.episodes.runner import EpisodeResult, _Live

    loop = _loop(cfg)
    played: list[Any] = []

    def play(runner: Any, seeds: list[int], tasks: Any, what: str, writer: Any = None) -> list[Any]:
        played.append((what, list(seeds), tasks))
        return []

    loop._play = play
    runtime = _runtime(cfg)
    for step in range(6):
        loop._rollout(runtime, step)
    loop._play_eval(runtime)
    runner = loop._runner(runtime, greedy=False)
    names = [a.name for a in cfg.agents]
    live = _Live(None, 0, "e", {a: f"observation of {a}" for a in names}, {}, {}, EpisodeResult("e", 0))
    prompts = {a: runner._turn_prompt(live, a, 0)[0] for a in names}
    wf = runner.workflow
    speakers = [wf.speakers(WorkflowState(t, names, [names[0]], {}, {})) for t in range(6)]
    roles = {
        a: (
            wf.role(a).parser("offer: 40") if wf.role(a).parser else None,
            wf.role(a).policy(prompts[a]) if wf.role(a).policy else None,
        )
        for a in names
    }
    rewards = wf.rewards(EpisodeView(names, [], {names[0]: 1.0, names[-1]: 0.0}, {}, {}, 0))
    return repr([loop.run_dir, played, runner.run_id, runner.roles, prompts, speakers, roles, rewards])


def _fixed_results(cfg: TrainConfig) -> list[Any]:
    """One step's episodes for the curriculum: per task, two complete (``task_completion`` 1) and two partial
    (0.6) episodes, every credited return 0."""
    from services.trainer.rollout.episodes.runner import EpisodeResult

    tasks = [t.name for t in cfg.tasks] or [None]
    returns = {a.name: 0.0 for a in cfg.agents}
    return [
        EpisodeResult(f"e{i}", i, returns=dict(returns), metrics={"task_completion": v}, task=task)
        for task in tasks
        for i, v in enumerate((1.0, 1.0, 0.6, 0.6))
    ]


def _curriculum(cfg: TrainConfig) -> str:
    """Six curriculum steps of the loop on :func:`_fixed_results` (its per-task metrics), each followed by the
    env config the next episode would get (its difficulty)."""
    loop = _loop(cfg)
    made: list[Any] = []
    loop._env_for = lambda name, seed, config: made.append(config.get("difficulty"))
    steps = []
    for _ in range(6):
        steps.append(loop._curriculum_step(_fixed_results(cfg)) if loop.curriculum is not None else None)
        loop._make_env(0)
        for task in cfg.tasks:
            loop._make_task_env(0, task.name)
    return repr([steps, made])


def _allocation(cfg: TrainConfig) -> str:
    """Six steps of the loop's priority allocation: agent ``a`` answers in 4 tokens with a rising reward, ``b``
    in 8 with a flat one; 8 samples each in 4 groups (the rows of one-turn trajectories, as the policy actors'
    batch summaries give them). Reports the shares, terms and the cut batch sizes."""
    from services.trainer.data.table_sampler import TrainedRow
    from services.trainer.learn.allocation import allocate_step

    loop = _loop(cfg)
    if loop.allocator is None:
        return "no allocation"
    names = [a.name for a in cfg.agents]
    out = []
    for reward in (0.0, 0.5, 0.7, 1.5, 1.6, 2.4):
        batches = {
            agent: [TrainedRow(2 * g + k, f"g{g}", 1, 4 * (i + 1)) for g in range(4) for k in range(2)]
            for i, agent in enumerate(names)
        }
        metrics = {f"{names[0]}/reward": reward, f"{names[-1]}/reward": 0.2}
        cut, alloc = allocate_step(loop.allocator, batches, metrics, loop.cfg.allocation.budget_samples)
        out.append(({a: len(s) for a, s in cut.items()}, alloc))
    return repr(out)


def _gateway(cfg: TrainConfig) -> str:
    """The gateway the loop's ``_start_gateway`` builds (its limits, sink, trainable agents and the server's bind
    address; ``Gateway``, ``GatewayServer`` and the backend recorded) and how long ``_linger`` then waits."""
    made: list[Any] = []

    class Gateway:
        def __init__(
            self,
            backend: Any,
            limits: Any = None,
            sink: Any = None,
            trainable: Any = None,
            max_staleness: Any = None,
            tool_parser: str = "",
            tool_parsers: Any = None,
        ) -> None:
            made.append(("gateway", limits, sink is not None, trainable, max_staleness))
            made.append(("tool parsers", tool_parser, tool_parsers))

        def models(self) -> list[Any]:
            return []

    class Server:
        def __init__(self, gateway: Any, **kwargs: Any) -> None:
            made.append(("server", kwargs))

        def start(self) -> tuple[str, str]:
            return "http://gateway/v1", "gateway:1"

    class Event:
        def is_set(self) -> bool:
            return False

        def wait(self, timeout: float) -> None:
            made.append(("linger", timeout))

    loop = _loop(cfg)
    loop.writer = object()
    loop.stop_event = Event()
    with (
        tempfile.TemporaryDirectory() as tmp,
        mock.patch("services.gateway.core.gateway.Gateway", Gateway),
        mock.patch("services.gateway.server.GatewayServer", Server),
        mock.patch(
            "services.trainer.rollout.serving.gateway_backend.TrainerBackend.for_job",
            lambda runtime, cfg: None,
        ),
        contextlib.redirect_stdout(io.StringIO()),
    ):
        loop.run_dir = Path(tmp)
        loop._start_gateway(None)
        loop._linger()
    return repr(made)


@contextlib.contextmanager
def _fake_wandb(inits: list[dict[str, Any]]) -> Any:
    """A ``wandb`` module whose ``init`` records its kwargs (without the run's paths)."""
    module = types.ModuleType("wandb")
    module.__spec__ = importlib.machinery.ModuleSpec("wandb", None)

    def init(**kwargs: Any) -> Any:
        inits.append({k: v for k, v in kwargs.items() if k not in ("dir", "config")})
        return SimpleNamespace(log=lambda *a, **k: None, finish=lambda: None)

    module.init = init  # type: ignore[attr-defined]
    with mock.patch.dict(sys.modules, {"wandb": module}):
        yield


def _run(cfg: TrainConfig) -> str:
    """:meth:`TrainingLoop.run` in a fresh run directory against fakes: a Ray runtime that saves empty
    checkpoints, store tables that record what each update takes (and hand back nothing), a resource monitor, a
    wandb module; no rollout is played (``_rollout`` and ``_play_eval`` return no episodes), the gateway start is
    recorded. Reports the summary, evaluations, checkpoints saved and kept, steps written to metrics.jsonl,
    TensorBoard and wandb use, the tables' bounds, every take, the producer's bound and gateway starts."""
    from marti.clients import experience
    from services.trainer import observe
    from services.trainer.data.table_sampler import BatchSummary
    from services.trainer.job.run import loop as loop_mod
    from services.trainer.observe import monitor

    rec: dict[str, Any] = {"takes": [], "saves": [], "producer": [], "gateway": 0, "wandb": []}

    def claim_tables(store: Any, name: str, bounds: Any, max_size: int, reconnecting: Any) -> Any:
        rec["claimed"] = (list(bounds), bounds, max_size)
        return {a: f"{name}/{a}" for a in bounds}, 0

    class Writer:
        def __init__(self, store: Any, tables: Any, reconnecting: Any, external: Any, **kwargs: Any) -> None:
            rec["tables"] = (*rec.pop("claimed"), kwargs.get("full_timeout_s"))
            rec["writer_stop"] = kwargs.get("stop")

    class Reader:
        def __init__(self, sample: Any, tables: Any, reconnecting: Any, external: Any) -> None:
            self.external = external

        def take(self, agent: str, count: int, version: int, deadline: Any = None, stop: Any = None) -> Any:
            wait = None if deadline is None else round(deadline - time.monotonic(), -1)
            rec["takes"].append((agent, count, wait))
            return SimpleNamespace(item_ids=[], stale=0, dropped=0)

    class Runtime:
        worker_pids: dict[str, int] = {}

        def __init__(self, cfg: TrainConfig) -> None:
            self.cfg = cfg

        def start(self) -> None:
            pass

        def versions(self) -> dict[str, int]:
            return {a.name: 0 for a in self.cfg.agents}

        def batch_summary(self, agent: str, version: int) -> Any:
            return BatchSummary()

        def save(self, path: str, position: dict[str, Any]) -> None:
            Path(path).mkdir(parents=True, exist_ok=True)
            rec["saves"].append(position["step"])

        def shutdown(self) -> None:
            pass

    class Producer(loop_mod.RolloutProducer):
        def __init__(self, play: Any, *, start: int, stop: int, max_staleness: int) -> None:
            rec["producer"].append(max_staleness)
            super().__init__(play, start=start, stop=stop, max_staleness=max_staleness)

    class Monitor:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def start(self) -> Monitor:
            return self

        def sample(self) -> dict[str, float]:
            return {}

        def stop(self) -> None:
            pass

    store = SimpleNamespace(close=lambda: None)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = cfg.model_copy(update={"output": cfg.output.model_copy(update={"dir": tmp})})
        with (
            mock.patch.multiple(
                loop_mod,
                RayRuntime=Runtime,
                claim_tables=claim_tables,
                EpisodeWriter=Writer,
                BatchReader=Reader,
                RolloutProducer=Producer,
            ),  # fmt: skip
            mock.patch.object(experience, "ExperienceSharingClient", lambda *args, **kwargs: store),
            mock.patch.multiple(monitor, ResourceMonitor=Monitor, child_service_pids=dict),
            mock.patch.object(observe, "write_report", lambda run_dir: None),
            _fake_wandb(rec["wandb"]),
        ):
            loop = _loop(cfg)
            loop._rollout = lambda runtime, step: ([], 0.0)
            loop._play_eval = lambda runtime: []
            loop._env_for = lambda name, seed, config: marti.make(name, seed=seed, **config)  # check_envs
            loop._start_gateway = lambda runtime: rec.__setitem__("gateway", rec["gateway"] + 1)
            summary = loop.run()
            # a wait for room in a full table ends when the job stops
            assert rec.pop("writer_stop") is loop.stop_event, (
                "the episode writer is not given the job's stop event"
            )
        run_dir = Path(tmp)
        logged = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        kept = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))
        tensorboard = (run_dir / "tensorboard").exists()
    return repr(
        [
            (summary.steps, summary.stopped, summary.epochs, summary.epoch_limited),
            [step for step, _ in summary.eval_history],
            kept,
            logged,
            tensorboard,
            rec,
        ]
    )


BUILDERS = {
    "learner": _learner,
    "engine": _engine,
    "placement": _placement,
    "env": _env,
    "services": _services,
    "episodes": _episodes,
    "curriculum": _curriculum,
    "allocation": _allocation,
    "gateway": _gateway,
    "run": _run,
}
