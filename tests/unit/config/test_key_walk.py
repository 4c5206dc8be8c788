"""Every documented config key changes what a job does.

Walks the keys of docs/config.md's generated KEYS block (``config_reference_markdown``). Each key is covered in
at least one of three ways, and :func:`test_every_key_is_covered` fails for a key that is covered in none:

- **built**: set to a non-default value (:data:`VALUES`, else :func:`_other_value`), on top of the settings it
  needs to apply (:data:`CONTEXT`, applied to both sides; a key with two consumers that need different settings
  is walked once under each), the key must change the output of *each* builder it is mapped to
  (:func:`builders_of`: :data:`KEY_BUILDERS`, else :data:`SECTION_BUILDERS`). A builder runs the trainer's own
  code on the config and reports what that code built or did, never the raw config:

  - ``learner``: algorithm settings, the optimizer settings of a policy's and a critic's train engine (LR
    schedule length and warmup), the policy layout, vLLM engine count and kwargs, every agent's sampling
    parameters;
  - ``engine``: the rollout engine :func:`~services.trainer.rollout.engines.generation.build_rollout_engine` builds on a CPU and
    a CUDA actor (engine constructors recorded, not run);
  - ``placement``: the Ray actors, their placement-group bundles and concurrency
    (:class:`~services.trainer.ray.runtime.RayRuntime`), the ``ray.init`` kwargs, the resolved device;
  - ``env``: the env name and config the loop's ``_make_env`` / ``_make_task_env`` hand to ``marti.make``, and
    the return scaling of ``reward_alloc``;
  - ``services``: the addresses and token ``marti train`` resolves (:func:`~services.trainer.job.cli.train_cli.service_addresses`,
    with the embedded stack recorded, not started) and the reconnect backoff of the loop;
  - ``episodes``: the seeds and tasks the loop's training rollouts and evaluations play, its run directory, and
    the episode runner it builds: run id, roles, every agent's chat prompt, the speakers of six turns, role
    parsers and scripts, the credited rewards of a fixed episode;
  - ``curriculum`` / ``allocation``: the loop's curriculum steps (levels, success rates, the env difficulty) and
    priority allocation (shares, cut batches) over six steps of fixed episodes;
  - ``gateway``: the gateway the loop starts (limits, bind address; server and backend recorded) and its
    linger wait;
  - ``run``: a whole :meth:`~services.trainer.job.run.loop.TrainingLoop.run` against fakes (Ray runtime, store tables,
    resource monitor, wandb; no env, no model): steps run, evaluations, checkpoints saved and kept, steps
    logged, loggers opened, the tables' staleness bounds, the items each update takes and its deadline, the
    asynchronous producer, whether the gateway started.
- **effect test**: a key whose effect no builder shows (inside a model update, a loaded model or DeepSpeed
  engine, or the config check of ``num_agents``) names in :data:`EFFECT_TESTS` the test that fails when the key
  does nothing; :func:`test_each_effect_test_exists` checks that the test exists (the new ones are in
  tests/unit/config/test_key_effects.py, the others beside the code they exercise).
- **container**: a section key, or a list of sections (``agents``, ``gateway``, ``workflow.roles``,
  ``agents.N.sampling``): covered by its child keys, each of which must be covered (checked).

Besides, :func:`test_builders_give_the_same_output_twice` checks that no builder's output changes by itself (an
object id, a temporary path, a clock), which would let every key pass, and
:func:`test_the_tables_name_only_documented_keys` that the tables name no key the docs do not list.

There is no list of accepted-but-inert keys: a key that changes none of its builders' output fails here.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.machinery
import io
import json
import os
import re
import sys
import tempfile
import time
import types
import typing
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest

import marti
from marti.config import TrainConfig, config_from_dict, config_reference_markdown

ROOT = Path(__file__).resolve().parents[3]
KEYS = re.findall(r"^\| `([^`]+)` \|", config_reference_markdown(), re.M)
#: The import-path callables of the workflow keys (tests/unit/config/test_key_effects.py, loaded by path).
HELPERS = str(Path(__file__).resolve().with_name("test_key_effects.py"))

BASE: dict[str, Any] = {
    "training_name": "t",
    "agents": [
        {"name": "a", "pretrain_model": "m", "role": "planner"},
        {"name": "b", "pretrain_model": "m", "role": "executor"},
    ],
    "device": "cuda",
}


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
    from services.trainer.ray.policy_worker import resolve_device
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
    with mock.patch("marti.stack.LocalStack", Stack), contextlib.redirect_stdout(io.StringIO()):
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
    from marti.workflow import EpisodeView, WorkflowState
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

# ---------------------------------------------------------------------------------------------- the tables
#: Builders of every key under a prefix (the longest matching prefix wins; :data:`KEY_BUILDERS` overrides).
SECTION_BUILDERS: dict[str, tuple[str, ...]] = {
    "algorithm.": ("learner",),
    "policy.": ("learner",),
    "strategy.": ("learner",),
    "vllm.": ("learner",),
    "agents.N.sampling.": ("learner",),
    "environment.": ("env",),
    "reward_alloc.": ("env",),
    "ray.": ("placement",),
    "services.": ("services",),
    "output.": ("run",),
    "budget.": ("run",),
    "workflow.": ("episodes",),
    "tasks.N.": ("env",),
    "curriculum.": ("curriculum",),
    "allocation.": ("allocation",),
    "gateway.": ("gateway",),
    "external.": ("run",),
    "rollout.": ("episodes",),
}

#: Builders of single keys: the top-level and per-agent keys, and the keys a section's builder does not see.
KEY_BUILDERS: dict[str, tuple[str, ...]] = {
    "training_name": ("episodes",),
    "max_steps": ("run", "learner"),
    "micro_train_batch_size": ("learner",),  # the LR schedule's length; the update: EFFECT_TESTS
    "gradient_accumulation_steps": ("learner",),
    "max_epochs": ("run", "learner"),
    "learning_rate": ("learner",),
    "lr_scheduler": ("learner",),
    "lr_warmup_ratio": ("learner",),
    "lr_warmup_steps": ("learner",),
    "seed": ("learner", "episodes"),  # the models' seed; the task draws
    "device": ("placement",),
    "task_sampling": ("episodes",),
    "agents.N.name": ("learner",),
    "agents.N.pretrain_model": ("learner",),
    "agents.N.role": ("env", "episodes"),
    "agents.N.num_gpus": ("placement",),
    "agents.N.num_cpus": ("placement",),
    "agents.N.capabilities": ("episodes",),
    "agents.N.is_tuning": ("learner", "run"),
    "agents.N.prompt_template": ("episodes",),
    "agents.N.learning_rate": ("learner",),
    "agents.N.ref_model": ("learner",),
    "agents.N.max_staleness": ("run",),
    "ray.colocate_models": ("placement", "learner"),
    "output.dir": ("episodes", "services"),
    "services.reconnect_timeout_s": ("services", "run"),  # the reconnects; how long an insert waits for room
    "tasks.N.name": ("episodes",),
    "tasks.N.weight": ("episodes",),
    "tasks.N.difficulty": ("env", "curriculum"),  # the task's env; the curriculum's first level
    "environment.difficulty": ("env", "curriculum"),
    "rollout.engine": ("engine",),
    "rollout.dtype": ("engine",),
    "rollout.merge_adapters": ("engine",),
    "rollout.source": ("run",),
    "rollout.episodes_per_step": ("episodes", "run"),
    "rollout.max_new_tokens": ("learner",),
    "rollout.temperature": ("learner",),
    "rollout.top_p": ("learner",),
    "rollout.eval_every": ("run",),
    "rollout.max_staleness": ("run", "placement"),
    "gateway.enabled": ("run", "placement"),
    "external.episode_timeout_s": ("gateway",),
}

#: Keys whose effect no builder shows (inside a model update, a loaded model or DeepSpeed engine, a config check):
#: the test that fails when the key does nothing.
EFFECT_TESTS = {
    "num_agents": "tests/unit/config/test_config_schema.py::test_num_agents_must_match_agents",
    "micro_train_batch_size": (
        "tests/unit/config/test_key_effects.py::test_the_policy_update_takes_its_settings_from_the_config"
    ),
    "gradient_accumulation_steps": (
        "tests/unit/config/test_key_effects.py::test_the_policy_update_takes_its_settings_from_the_config"
    ),
    "rollout.tis_cap": (
        "tests/unit/config/test_key_effects.py::test_the_policy_update_takes_its_settings_from_the_config"
    ),
    "agents.N.response_prefix": (
        "tests/unit/config/test_key_effects.py::test_response_prefix_ends_the_prompt_and_starts_the_text"
    ),
    "agents.N.critic_model": (
        "tests/unit/config/test_key_effects.py::test_critic_model_is_the_model_the_critic_is_loaded_from"
    ),
    "policy.mode": "tests/unit/trainer/models/test_policy.py::test_lora_mode_keeps_one_base_copy_and_separate_adapters",
    "policy.ema": "tests/unit/trainer/learn/test_ema.py::test_evaluation_uses_the_ema_weights_and_rollouts_the_trained_ones",
    "policy.ema_beta": "tests/unit/trainer/learn/test_ema.py::test_ema_equals_the_hand_computed_average_after_each_optimizer_step",
    "strategy.name": "tests/unit/trainer/strategy/test_strategy.py::test_make_strategy_by_name",
    "strategy.zero_stage": "tests/unit/trainer/strategy/test_strategy.py::test_deepspeed_zero_stages_train_and_resume_on_cpu",
    "strategy.critic_zero_stage": (
        "tests/unit/trainer/learn/test_openrlhf_settings.py::test_critic_zero_stage_reaches_the_critics_deepspeed_config"
    ),
    # the problems marti.data.load_problems builds from the section
    **{
        key: "tests/unit/data/test_data_key_effects.py::test_each_dataset_key_changes_the_loaded_problems"
        for key in KEYS if key.startswith("dataset.")
    },
    # the scores of the trainer's build_scorer (a real HTTP server, the reward-model actor class in-process)
    **{
        key: "tests/integration/rewards/test_reward_key_effects.py::test_each_reward_key_changes_the_scores"
        for key in KEYS if key.startswith("reward.") and not key.startswith("reward.judge_")
    },
    # the LLM judge's verdict is the reward, through EpisodeScorer and the episode runner
    "reward.judge_agent": "tests/unit/trainer/data/test_data_workflows.py::test_the_frozen_judges_verdict_is_the_reward",
    "reward.judge_pattern": "tests/unit/trainer/data/test_data_workflows.py::test_judge_pattern_reads_the_verdict",
    "reward.judge_pattern_timeout_s": "tests/unit/trainer/data/test_data_workflows.py::test_a_judge_pattern_that_backtracks_is_scored_0_with_a_warning_and_the_job_goes_on",
}  # fmt: skip

#: Settings a key takes effect beside, applied to both sides of the comparison; a list: the key is walked once
#: under each (a key with two consumers that need different settings).
RUN = {"max_steps": 4, "output.log_with": []}  # a short run; TensorBoard only where the key is about loggers
TASKS = {"tasks": [{"name": "t1"}, {"name": "t2"}]}
ROLE = {"workflow.roles": [{"agent": "a"}]}
CURRICULUM = {"curriculum.enabled": True}
ALLOCATION = {"allocation.enabled": True}
DEBATE = {"workflow.kind": "debate", "workflow.aggregator": "b"}
MIXED = {**RUN, "rollout.source": "mixed"}
GAE = {"algorithm.advantage_estimator": "gae"}  # the critic's keys: another estimator refuses them unread
CONTEXT: dict[str, dict[str, Any] | list[dict[str, Any]]] = {
    "max_steps": RUN,
    **{k: GAE for k in ("algorithm.lambd", "algorithm.value_clip", "algorithm.critic_learning_rate")},
    **{
        k: GAE
        for k in ("agents.N.critic_model", "strategy.critic_zero_stage", "algorithm.normalize_advantages")
    },
    "algorithm.loss_norm_tokens": {"algorithm.loss_agg_mode": "seq-mean-token-sum-norm"},  # its only reader
    "algorithm.gamma": {"algorithm.advantage_estimator": "reinforce++"},  # grpo's outcome scores: no discount
    "policy.ema_beta": {"policy.ema": True},
    "seed": TASKS,  # the task draws
    "max_epochs": {**RUN, "rollout.num_train_seeds": 2},  # epochs need a finite problem set
    "task_sampling": {**TASKS, "algorithm.advantage_estimator": "reinforce++"},  # episode draws: no groups
    # A template that names {capabilities}: the built-in system prompt does not list them.
    "agents.N.capabilities": {"agents.0.prompt_template": "{name}, {role}: {capabilities}"},
    "agents.N.max_staleness": {**RUN, "rollout.max_staleness": 2},
    "services.tls_ca_file": {
        "services.env": "env-host:1"
    },  # a given address: the embedded stack is plaintext
    "agents.N.is_tuning": RUN,
    "output.save_every": RUN,
    "output.keep_checkpoints": {**RUN, "output.save_every": 1},
    "output.log_every": RUN,
    "output.log_with": {"max_steps": 2},
    "output.wandb_project": {**RUN, "output.log_with": ["wandb"]},
    "output.wandb_run_name": {**RUN, "output.log_with": ["wandb"]},
    "budget.max_wall_time_s": RUN,
    "budget.stop_after_steps": RUN,
    "rollout.source": RUN,
    "rollout.episodes_per_step": RUN,
    "rollout.eval_every": RUN,
    "rollout.max_staleness": RUN,
    "gateway.enabled": RUN,
    "external.episodes_per_step": MIXED,
    "external.wait_timeout_s": MIXED,
    "workflow.order": {"workflow.kind": "chain"},
    "workflow.aggregator": DEBATE,
    "workflow.rounds": DEBATE,
    "workflow.next_speakers": {
        "workflow.kind": "custom",
        "workflow.next_speakers": f"{HELPERS}:first_speaker",
    },
    "workflow.reward_custom_weight": {"workflow.reward_fn": f"{HELPERS}:first_agent_wins"},
    "workflow.roles.N.agent": {"workflow.roles": [{"agent": "a", "system_prompt": "the role of {name}"}]},
    "workflow.roles.N.system_prompt": ROLE,
    "workflow.roles.N.prompt_builder": ROLE,
    "workflow.roles.N.parser": ROLE,
    "workflow.roles.N.scripted": {**ROLE, "agents.0.is_tuning": False},  # a script is not trained
    **{k: TASKS for k in KEYS if k.startswith("tasks.N.")},
    "tasks.N.difficulty": [TASKS, {**TASKS, **CURRICULUM}],
    "environment.difficulty": [{}, CURRICULUM],
    **{k: CURRICULUM for k in KEYS if k.startswith("curriculum.") and k != "curriculum.enabled"},
    # every episode succeeds, so a level rises once a full window is seen
    "curriculum.window": {**CURRICULUM, "curriculum.success_value": 0.5},
    **{k: ALLOCATION for k in KEYS if k.startswith("allocation.") and k != "allocation.enabled"},
}

#: Non-default values where :func:`_other_value`'s is invalid, takes no effect, or there is none (lists, dicts).
VALUES: dict[str, Any] = {
    "max_steps": 2,
    "lr_scheduler": "cosine_with_min_lr",  # every name: tests/unit/trainer/strategy/test_strategy.py
    "agents.N.num_cpus": 4.0,  # above ray.num_cpus_per_worker, the least an actor reserves
    "agents.N.capabilities": ["planning", "coordination"],
    "agents.N.max_staleness": 1,
    "environment.options": {"history_messages": 2},
    "tasks.N.options": {"history_messages": 2},
    "ray.address": "auto",
    "ray.num_cpus_per_worker": 2.0,  # above the agents' num_cpus
    "rollout.engine": "vllm",
    "rollout.dtype": "bfloat16",  # the transformers engines' kwargs; "auto" resolves per machine
    "rollout.episodes_per_step": 4,  # a multiple of group_size
    "rollout.group_size": 2,
    "rollout.eval_every": 2,
    "rollout.eval_seeds": list(range(100, 116)),  # eval_episodes of them
    "output.log_with": ["wandb"],
    "budget.max_wall_time_s": 1e-9,  # spent by the first step
    "gateway.host": "0.0.0.0",
    "gateway.resident_versions": 2,  # 1 is the null default's value without staleness
    "gateway.tool_parser": "mistral",
    "gateway.tool_parsers": {"b": "mistral"},
    "workflow.order": ["b", "a"],
    "workflow.aggregator": "a",
    "workflow.next_speakers": f"{HELPERS}:last_speaker",
    "workflow.factory": f"{HELPERS}:chain_of_the_last_agent",
    "workflow.reward_fn": f"{HELPERS}:first_agent_wins",
    "workflow.roles.N.agent": "b",
    "workflow.roles.N.prompt_builder": f"{HELPERS}:marked_prompt",
    "workflow.roles.N.parser": f"{HELPERS}:shouting_parser",
    "workflow.roles.N.scripted": f"{HELPERS}:scripted_reply",
    "curriculum.levels": ["medium", "hard"],
    "environment.difficulty": "medium",  # easy is the curriculum's first level
    "tasks.N.difficulty": "medium",
}

#: Sections and lists of sections: covered by their child keys.
CONTAINERS = [k for k in KEYS if any(other.startswith(k + ".") for other in KEYS)]


def builders_of(key: str) -> tuple[str, ...]:
    """The builders whose output ``key`` must change (none for a container or an effect-test-only key)."""
    if key in KEY_BUILDERS:
        return KEY_BUILDERS[key]
    prefixes = [p for p in SECTION_BUILDERS if key.startswith(p)]
    if key in CONTAINERS or key in EFFECT_TESTS or not prefixes:
        return ()
    return SECTION_BUILDERS[max(prefixes, key=len)]


# ---------------------------------------------------------------------------------------------- values
def _other_value(cfg: TrainConfig, key: str) -> Any:
    """A valid non-default value for ``key`` (from its type)."""
    node: Any = cfg
    for part in key.split(".")[:-1]:
        if part == "N":
            node = node[0]
            continue
        node = getattr(node, part)
    leaf = key.split(".")[-1]
    info = type(node).model_fields[leaf]
    current = getattr(node, leaf)
    tp = info.annotation
    union = typing.get_origin(tp) in (typing.Union, types.UnionType)
    args = [a for a in typing.get_args(tp) if a is not type(None)] if union else [tp]
    base = args[0]
    if typing.get_origin(base) is typing.Annotated:
        base = typing.get_args(base)[0]
    if typing.get_origin(base) is typing.Literal:
        return next(v for v in typing.get_args(base) if v != current)
    if base is bool:
        return not current
    if base is int:
        return 1 if current in (None, 0) else (0 if leaf.endswith("stage") else current + 1)
    if base is float:
        if leaf == "dual_clip":
            return 3.0
        return 0.5 if current in (None, 0.0, 1.0) else current / 2
    if typing.get_origin(base) is list and typing.get_args(base)[0] is str:
        return ["q_proj"] if current != ["q_proj"] else ["v_proj"]
    if base is str:
        return "another-model"
    return None


def _set(raw: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(raw)
    node: Any = out
    parts = key.replace(".N.", ".0.").split(".")
    for part in parts[:-1]:
        node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
    node[parts[-1]] = copy.deepcopy(value)
    return out


def _contexts(key: str) -> list[dict[str, Any]]:
    """The settings ``key`` is walked under (one or several, see :data:`CONTEXT`)."""
    found = CONTEXT.get(key, {})
    return found if isinstance(found, list) else [found]


def _with(raw: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    for key, value in settings.items():
        raw = _set(raw, key, value)
    return raw


_CACHE: dict[tuple[str, str], str] = {}


def _built(builder: str, raw: dict[str, Any]) -> str:
    """``BUILDERS[builder]`` of the config ``raw`` (cached: the base configs repeat)."""
    key = (builder, json.dumps(raw, sort_keys=True))
    if key not in _CACHE:
        _CACHE[key] = BUILDERS[builder](config_from_dict(raw))
    return _CACHE[key]


# ---------------------------------------------------------------------------------------------- the tests
def test_the_walk_sees_every_section():
    assert len(KEYS) > 150 and "algorithm.normalize_reward" in KEYS and "policy.ema" in KEYS
    assert {"agents", "gateway", "workflow.roles", "agents.N.sampling", "tasks"} <= set(CONTAINERS)


@pytest.mark.parametrize("key", KEYS)
def test_every_key_is_covered(key):
    covered = key in CONTAINERS or key in EFFECT_TESTS or builders_of(key)
    assert covered, (
        f"{key}: no builder, effect test or child key covers it; map it in KEY_BUILDERS or EFFECT_TESTS"
    )


def _children(key: str) -> list[str]:
    """The keys one level below ``key`` (``agents`` -> ``agents.N.name``, ..., ``agents.N.sampling``)."""
    out = []
    for k in KEYS:
        rest = k[len(key) + 1 :] if k.startswith(key + ".") else None
        rest = rest[2:] if rest and rest.startswith("N.") else rest
        if rest and "." not in rest:
            out.append(k)
    return out


@pytest.mark.parametrize("key", CONTAINERS)
def test_container_keys_are_covered_by_their_children(key):
    children = _children(key)
    assert children, f"{key}: a container without child keys"
    for child in children:
        assert child in CONTAINERS or child in EFFECT_TESTS or builders_of(child), f"{child} is not covered"


def test_the_tables_name_only_documented_keys():
    named = [*KEY_BUILDERS, *EFFECT_TESTS, *CONTEXT, *VALUES]
    assert sorted(k for k in named if k not in KEYS) == []
    assert all(
        name in BUILDERS for names in [*SECTION_BUILDERS.values(), *KEY_BUILDERS.values()] for name in names
    )


@pytest.mark.parametrize("key", sorted(EFFECT_TESTS))
def test_each_effect_test_exists(key):
    path, name = EFFECT_TESTS[key].split("::")
    body = (ROOT / path).read_text()
    match = re.search(rf"^def {name}\(.*?(?=^def |\Z)", body, re.M | re.S)
    assert match, f"{key}: {EFFECT_TESTS[key]} does not exist"
    assert key in KEYS


WALKED = [(k, i) for k in KEYS if builders_of(k) for i in range(len(_contexts(k)))]


@pytest.mark.parametrize(("key", "case"), WALKED, ids=[f"{k}" + (f"-{i}" if i else "") for k, i in WALKED])
def test_keys_change_what_their_builders_produce(key, case):
    context = _contexts(key)[case]
    raw_base = _with(BASE, context)
    value = VALUES[key] if key in VALUES else _other_value(config_from_dict(raw_base), key)
    assert value is not None, f"{key}: no generic non-default value; give one in VALUES"
    raw = _set(raw_base, key, value)
    unchanged = [b for b in builders_of(key) if _built(b, raw) == _built(b, raw_base)]
    assert not unchanged, (
        f"{key}={value!r} (with {context}): no change in what {', '.join(unchanged)} produce(s)"
    )


@pytest.mark.parametrize("builder", sorted(BUILDERS))
def test_builders_give_the_same_output_twice(builder):
    """A builder whose output held an object id, a temporary path or a time would see every key change it."""
    contexts = {
        json.dumps(c, sort_keys=True): c for k, _ in WALKED if builder in builders_of(k) for c in _contexts(k)
    }
    for context in contexts.values():
        raw = _with(BASE, context)
        assert BUILDERS[builder](config_from_dict(raw)) == BUILDERS[builder](config_from_dict(raw)), context
