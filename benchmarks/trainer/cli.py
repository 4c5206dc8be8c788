"""The command line of ``marti bench trainer`` (:mod:`benchmarks.trainer`): its flags and checks, the run of
every side, each in a fresh process, and the report of the run folder."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.report import write_json
from benchmarks.trainer import sum_task
from benchmarks.trainer.report import SIDES, TRL_ARMS, comparisons, format_table, summarize

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TRL_VENV = Path.home() / ".cache" / "marti-bench" / "trl-venv"
#: ``--engine`` and ``--dtype``: our side's ``rollout.engine`` and ``rollout.dtype`` (the CPU's engines).
ENGINES = ("hf", "hf_static")
DTYPES = ("float32", "bfloat16", "auto")
#: ``--train-dtype``: what our update computes in (``strategy.bf16``: bf16 autocast over float32 weights).
TRAIN_DTYPES = ("float32", "bfloat16")
#: The defaults of our side's flags, the recorded settings (``args`` attribute -> value).
OUR_DEFAULTS = {"engine": "hf", "dtype": "float32", "train_dtype": "float32"}


def load_avg() -> float:
    """Return the 1-minute load average of this machine."""
    return os.getloadavg()[0]


# ---------------------------------------------------------------------------------------------- TRL venv
def installed_versions() -> dict[str, str]:
    """Versions of torch, transformers, peft and accelerate in this (the project's) environment."""
    from importlib.metadata import version

    return {p: version(p).split("+")[0] for p in ("torch", "transformers", "peft", "accelerate")}


def ensure_trl_venv(venv: Path) -> Path:
    """Create the TRL virtualenv if ``trl`` is not importable there; returns its python.

    torch is installed first at this environment's version (the CPU build) and pinned with a constraints file,
    so pip never pulls a CUDA build; transformers, peft and accelerate are pinned to this environment's.

    Raises:
        RuntimeError: An install step failed (the pip command is named).
    """
    py = venv / "bin" / "python"
    if (
        py.exists()
        and subprocess.call([str(py), "-c", "import trl, datasets"], stderr=subprocess.DEVNULL) == 0
    ):
        return py
    versions = installed_versions()
    venv.parent.mkdir(parents=True, exist_ok=True)
    constraints = venv.parent / "trl-constraints.txt"
    constraints.write_text("".join(f"{k}=={v}\n" for k, v in versions.items()))
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [str(venv / "bin" / "pip"), "install", "-q", f"torch=={versions['torch']}"],
        [str(venv / "bin" / "pip"), "install", "-q", "-c", str(constraints), "trl", "datasets"]
        + [f"{k}=={v}" for k, v in versions.items() if k != "torch"],
    ]
    for cmd in steps:
        print("+", " ".join(cmd), flush=True)
        if subprocess.call(cmd) != 0:
            raise RuntimeError(f"setting up the TRL virtualenv failed at: {' '.join(cmd)}")
    return py


# ---------------------------------------------------------------------------------------------- our side
def worker_config(spec: dict[str, Any]) -> dict[str, Any]:
    """The training config of our side (a one-agent team), equivalent to the TRL settings in the spec."""
    B = spec["prompts_per_step"] * spec["group_size"]
    policy: dict[str, Any] = {"mode": "lora" if spec["lora"] else "per_agent"}
    if spec["lora"]:
        policy.update(
            lora_r=spec["lora_r"],
            lora_alpha=spec["lora_alpha"],
            lora_target_modules=spec["lora_target_modules"],
        )
    return {
        "training_name": "bench_trainer",
        "num_agents": 1,
        "max_steps": spec["steps"],
        "micro_train_batch_size": B,
        "gradient_accumulation_steps": 1,
        "learning_rate": spec["lr"],
        "lr_scheduler": "constant",
        "seed": spec["seed"],
        "device": "cpu",
        "agents": [{"name": "solver", "pretrain_model": spec["model_dir"], "role": "solver"}],
        "algorithm": {
            "advantage_estimator": "grpo",
            "kl_coef": 0.0,
            "clip_eps_low": spec["clip_eps"],
            "clip_eps_high": spec["clip_eps"],
            "entropy_coef": 0.0,
            "loss_agg_mode": "token-mean",
            "ppo_epochs": 1,
        },
        "rollout": {
            "engine": spec.get("rollout_engine", "hf"),
            "dtype": spec.get("rollout_dtype", "float32"),
            "episodes_per_step": B,
            "group_size": spec["group_size"],
            "max_new_tokens": spec["max_new_tokens"],
            "temperature": spec["temperature"],
            "top_p": 1.0,
        },
        "policy": policy,
        "strategy": {
            "name": "torch",
            "grad_clip": spec["grad_clip"],
            "weight_decay": 0.0,
            "bf16": spec.get("train_dtype", "float32") == "bfloat16",
        },
        "output": {"log_with": []},
    }


def run_ours(spec: dict[str, Any]) -> dict[str, Any]:
    """Train with our GRPO (PolicyWorker) as the spec says; same result keys as the TRL runner.

    The first step runs under a :class:`~benchmarks.trainer.dtype_probe.DtypeProbe`: the result says which dtypes
    the generation and the update really computed in, and which engine class the worker built.

    Returns:
        ``train_time_s``, ``step_times_s``, ``generation_s`` (per step), ``step_rewards``,
        ``completion_tokens``, ``prompt_tokens``, ``samples``, ``eval`` (see
        :func:`benchmarks.trainer.sum_task.evaluate`),
        ``observed`` (:meth:`DtypeProbe.report` of step 1), ``rollout`` (``{"engine": class name, "dtype": the
        dtype it samples in, or None for the policy's}``).
    """
    import torch

    from benchmarks.trainer.dtype_probe import DtypeProbe
    from marti.config import config_from_dict
    from services.trainer.ray.policy_worker import PolicyWorker, policy_actor_config

    worker = PolicyWorker(
        policy_actor_config(config_from_dict(worker_config(spec))), num_threads=spec["threads"]
    )
    P = spec["prompts_per_step"]
    problems = spec["train_problems"]
    step_times, gen_times, step_rewards = [], [], []
    counts = {"completion_tokens": 0, "prompt_tokens": 0, "samples": 0}
    probe = DtypeProbe()
    t_start = time.perf_counter()
    for step in range(spec["steps"]):
        t0 = time.perf_counter()
        batch = problems[step * P : (step + 1) * P]
        chats = [sum_task.chat(p["question"]) for p in batch for _ in range(spec["group_size"])]
        with probe.phase("generation"):
            gens = worker.generate("solver", chats)
        gen_times.append(time.perf_counter() - t0)
        samples = _our_samples(step, gens, batch, spec["group_size"], counts)
        with probe.phase("update"):
            worker.train("solver", samples)
        probe.stop()  # step 1 only: the hook costs a little on every module call
        counts["samples"] += len(samples)
        step_rewards.append(statistics.mean(t.outcome_reward for t in samples))
        step_times.append(time.perf_counter() - t0)
    train_time = time.perf_counter() - t_start
    model = worker.policy.model("solver")
    with torch.no_grad():
        ev = sum_task.evaluate(
            model, worker.policy.tokenizer("solver"), spec["eval_problems"], spec["max_new_tokens"]
        )
    dtype = worker.engine.dtype
    return {
        "train_time_s": train_time,
        "step_times_s": step_times,
        "generation_s": gen_times,
        "step_rewards": step_rewards,
        **counts,
        "eval": ev,
        "observed": probe.report(),
        "rollout": {
            "engine": type(worker.engine).__name__,
            "dtype": None if dtype is None else str(dtype).removeprefix("torch."),
        },
    }


def _our_samples(
    step: int, gens: list[Any], batch: list[dict[str, Any]], G: int, counts: dict[str, int]
) -> list[Any]:
    """The trajectories of one step's generations (row ``i`` answers ``batch[i // G]``), scored by the task's
    reward; adds their token counts to ``counts``."""
    from marti.trajectory import Trajectory, Turn

    samples = []
    for i, g in enumerate(gens):
        turn = Turn(0, list(g.prompt_token_ids), list(g.response_token_ids))
        reward = sum_task.reward(g.text, batch[i // G]["answer"])
        samples.append(
            Trajectory(f"{step}-{i}", "solver", group_id=str(i // G), episode_return=reward, turns=[turn])
        )
        counts["completion_tokens"] += len(g.response_token_ids)
        counts["prompt_tokens"] += len(g.prompt_token_ids)
    return samples


def prepare_model(name: str, seed: int, out: Path) -> Path:
    """Build or load ``name`` once (seeded) and save it with its tokenizer to ``out``; returns ``out``.

    Raises:
        NotFoundError: The model is not available locally (named, with the places looked).
    """
    from services.trainer.models.loading import load_model, load_tokenizer

    tok = load_tokenizer(name)
    model = load_model(name, tokenizer=tok, seed=seed)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _child(role: str, spec_path: Path, out_path: Path, python: str) -> dict[str, Any]:
    """Run one side in a fresh process (a TRL arm with its precision, :data:`TRL_ARMS`); returns its result JSON
    with the load average added."""
    if role in TRL_ARMS:
        runner = Path(__file__).resolve().parent / "trl_runner.py"
        cmd = [python, str(runner), str(spec_path), str(out_path), TRL_ARMS[role]]
    else:
        cmd = [python, "-m", "benchmarks.trainer", "--_ours", str(spec_path), str(out_path)]
    env = {
        **os.environ,
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": str(json.loads(spec_path.read_text())["threads"]),
    }
    load = load_avg()
    print(f"running {role} (load {load:.1f}) ...", flush=True)
    rc = subprocess.call(cmd, cwd=ROOT, env=env)
    if rc != 0:
        raise RuntimeError(f"{role} side exited with {rc}: {' '.join(cmd)}")
    result = json.loads(out_path.read_text())
    result["load"] = (load + load_avg()) / 2
    return result


def main(argv: list[str] | None = None) -> int:
    """Run both sides and print the comparison table (see the module docstring).

    Args:
        argv: Command-line arguments (see ``--help``).

    Returns:
        0 when every side ran (whether or not the target is met).
    """
    p = argparse.ArgumentParser(
        prog="marti bench trainer", description=sys.modules[__package__].__doc__.splitlines()[0]
    )
    p.add_argument("--model", default="tiny-llama", help="model name or folder (default tiny-llama)")
    p.add_argument("--steps", type=int, default=12, help="training steps N (default 12)")
    p.add_argument("--prompts", type=int, default=4, help="prompts per step (default 4)")
    p.add_argument("--group", type=int, default=4, help="completions per prompt G (default 4)")
    p.add_argument("--max-new-tokens", type=int, default=16, help="max tokens per completion (default 16)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1.0)")
    p.add_argument("--lr", type=float, default=1e-4, help="learning rate (default 1e-4)")
    p.add_argument("--lora", action="store_true", help="LoRA (r=8, alpha=16, q/k/v/o) on both sides")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="torch threads per side (default 2)")
    p.add_argument("--eval-problems", type=int, default=32, help="held-out problems (default 32)")
    p.add_argument("--repeats", type=int, default=1, help="alternate the sides this many times (default 1)")
    p.add_argument(
        "--engine", default=OUR_DEFAULTS["engine"], choices=ENGINES, help="our rollout.engine (default hf)"
    )
    p.add_argument(
        "--dtype", default=OUR_DEFAULTS["dtype"], choices=DTYPES, help="our rollout.dtype (default float32)"
    )
    p.add_argument(
        "--train-dtype",
        default=OUR_DEFAULTS["train_dtype"],
        choices=TRAIN_DTYPES,
        help="our update's compute dtype (strategy.bf16: bfloat16 autocast; default float32)",
    )
    p.add_argument(
        "--sides",
        nargs="+",
        choices=SIDES,
        help="sides to run (default: ours and trl, plus trl_bf16 when ours uses bfloat16: --dtype resolved "
        "here, or --train-dtype)",
    )
    p.add_argument("--trl-venv", default=str(DEFAULT_TRL_VENV), help="TRL virtualenv (created if missing)")
    p.add_argument("--out", default=str(ROOT / "runs" / "bench_trainer"), help="output folder")
    p.add_argument("--report-only", action="store_true", help="only print the table of the runs in --out")
    p.add_argument("--json", default=None, metavar="PATH", help="also write every number as JSON to PATH")
    p.add_argument("--_ours", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args._ours:
        spec = json.loads(Path(args._ours[0]).read_text())
        Path(args._ours[1]).write_text(json.dumps(run_ours(spec)))
        return 0
    _check_args(args)
    out = Path(args.out)
    if args.report_only:
        if not (out / "spec.json").is_file():
            raise SystemExit(f"--report-only: no earlier run in {out} (its spec.json is missing)")
        return _report(args, out)
    sides = args.sides or default_sides(args.dtype, args.train_dtype)
    out.mkdir(parents=True, exist_ok=True)
    for old in _side_files(out):  # a new run's table holds only its own sides
        old.unlink()
    trl_python = str(ensure_trl_venv(Path(args.trl_venv))) if set(sides) & set(TRL_ARMS) else ""
    model_dir = prepare_model(args.model, args.seed, out / "init_model")
    spec = {
        "model": args.model,
        "model_dir": str(model_dir),
        "steps": args.steps,
        "prompts_per_step": args.prompts,
        "group_size": args.group,
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "lr": args.lr,
        "clip_eps": 0.2,
        "grad_clip": 1.0,
        "lora": args.lora,
        "lora_r": 8,
        "lora_alpha": 16,
        "lora_target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
        "seed": args.seed,
        "threads": args.threads,
        "rollout_engine": args.engine,
        "rollout_dtype": args.dtype,
        "train_dtype": args.train_dtype,
        "train_problems": sum_task.make_problems(args.seed, args.steps * args.prompts),
        "eval_problems": sum_task.make_problems(10_000 + args.seed, args.eval_problems),
    }
    spec_path = out / "spec.json"
    spec_path.write_text(json.dumps(spec))
    from transformers import AutoModelForCausalLM, AutoTokenizer

    init_eval = sum_task.evaluate(
        AutoModelForCausalLM.from_pretrained(model_dir),
        AutoTokenizer.from_pretrained(model_dir),
        spec["eval_problems"],
        args.max_new_tokens,
    )
    (out / "init_eval.json").write_text(json.dumps(init_eval))
    for rep in range(args.repeats):
        for side in sides:
            python = sys.executable if side == "ours" else trl_python
            res = _child(side, spec_path, out / f"{side}_{rep}.json", python)
            (out / f"{side}_{rep}.json").write_text(json.dumps(res))
    return _report(args, out)


def _check_args(args: argparse.Namespace) -> None:
    """Refuse, before any model loads, arguments a run could not honour.

    Raises:
        SystemExit: A count that is not positive; a temperature or learning rate that is not a positive finite
            number; a side named twice; ``--engine``, ``--dtype`` or ``--train-dtype`` set away from its default
            without ``ours`` among ``--sides`` (they set only our side); a ``--json`` folder that does not exist.
    """
    for name in ("steps", "prompts", "group", "max_new_tokens", "threads", "eval_problems", "repeats"):
        if getattr(args, name) <= 0:
            raise SystemExit(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    for name in ("temperature", "lr"):
        value = getattr(args, name)
        if not (math.isfinite(value) and value > 0):
            raise SystemExit(f"--{name} must be a positive finite number, got {value}")
    if args.sides and len(set(args.sides)) != len(args.sides):
        raise SystemExit(f"--sides names a side twice: {args.sides} (use --repeats to run a side again)")
    changed = [
        f"--{k.replace('_', '-')}" for k, default in OUR_DEFAULTS.items() if getattr(args, k) != default
    ]
    if args.sides and "ours" not in args.sides and changed:
        raise SystemExit(
            f"{' '.join(changed)} set(s) only our side, which --sides {' '.join(args.sides)} leaves out"
        )
    if args.json and not Path(args.json).resolve().parent.is_dir():
        raise SystemExit(f"--json {args.json}: its folder does not exist")


def default_sides(dtype: str, train_dtype: str = "float32") -> list[str]:
    """The sides a run has by default: ours and TRL in float32, plus TRL in bf16 when our side uses bf16: its
    ``rollout.dtype`` (``dtype``) resolves to bfloat16 on this CPU (``auto`` does where it has AVX512-BF16 or
    AMX), or its update computes in bfloat16 (``train_dtype``)."""
    import torch

    from services.trainer.rollout.precision import resolve_rollout_dtype

    bf16 = resolve_rollout_dtype(dtype, "cpu") == torch.bfloat16 or train_dtype == "bfloat16"
    return ["ours", "trl", "trl_bf16"] if bf16 else ["ours", "trl"]


def _side_files(out: Path) -> dict[Path, str]:
    """The side result files ``<out>/<side>_<rep>.json`` -> their side (:data:`SIDES`)."""
    pattern = re.compile(rf"({'|'.join(SIDES)})_\d+\.json")
    found = {f: pattern.fullmatch(f.name) for f in sorted(out.glob("*_*.json"))}
    return {f: m.group(1) for f, m in found.items() if m}


def _report(args: argparse.Namespace, out: Path) -> int:
    """Print and save (``<out>/table.md``) the table of the side results ``<out>/<side>_<rep>.json``."""
    spec = json.loads((out / "spec.json").read_text())
    if not (out / "init_eval.json").is_file():
        raise SystemExit(
            f"no init_eval.json in {out}: the run stopped before the untrained model was evaluated"
        )
    init_eval = json.loads((out / "init_eval.json").read_text())
    steps = spec["steps"]
    tail = max(1, steps // 4)
    results: dict[str, list[dict[str, Any]]] = {}
    for f, side in _side_files(out).items():
        result = json.loads(f.read_text())
        if "train_time_s" not in result:
            raise SystemExit(f"{f} is not a side result of this bench (no train_time_s)")
        results.setdefault(side, []).append(result)
    if not results:
        names = ", ".join(f"{s}_*.json" for s in SIDES)
        raise SystemExit(f"no side results in {out} ({names}): the run did not finish a side")
    rows = []
    for side in (s for s in SIDES if s in results):
        best = min(results[side], key=lambda r: r["train_time_s"])  # least disturbed by other load
        rows.append(summarize(side, best, tail))
    reps = max(len(v) for v in results.values())
    print(
        f"\nmodel {spec.get('model', args.model)}, N={steps} steps x {spec['prompts_per_step']} prompts x "
        f"G={spec['group_size']}, "
        f"max_new_tokens={spec['max_new_tokens']}, T={spec['temperature']}, lr={spec['lr']}, "
        f"{'LoRA r=8' if spec['lora'] else 'full fine-tuning'}, {spec['threads']} threads, seed {spec['seed']}, "
        f"ours with rollout.engine {spec.get('rollout_engine', 'hf')} and rollout.dtype "
        f"{spec.get('rollout_dtype', 'float32')}, update in {spec.get('train_dtype', 'float32')}, "
        f"fastest of {reps} run(s) per side\n"
    )
    text = format_table(rows, init_eval, steps, tail)
    print(text)
    (out / "table.md").write_text(text + "\n")
    if args.json:
        doc = {
            "bench": "trainer",
            "spec": {k: v for k, v in spec.items() if not k.endswith("_problems")},
            "untrained_eval": init_eval,
            "sides": rows,
            "comparisons": comparisons(rows),
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        }
        write_json(args.json, doc)
        print(f"wrote {args.json}")
    return 0
