"""``marti bench trainer``: our GRPO against TRL's GRPOTrainer on one machine, same model, task, seeds.

Task: "What is a + b? Reply with only the number." (:mod:`benchmarks.sum_task`; reward 1 for the right sum,
0.1 for another integer, 0 for none). Both sides:

- start from the **same weights**: the model (``--model``, default ``tiny-llama``: a 2-layer Llama with the
  SmolLM2 tokenizer, seeded) is built once and saved to ``<out>/init_model``; both load that folder;
- see the **same problems in the same order** (``--steps`` x ``--prompts`` problems, TRL's shuffling off);
- sample **G = --group** completions per prompt with the same ``max_new_tokens`` and temperature (top-p 1,
  top-k off), transformers ``generate`` on the CPU (TRL without vLLM; ours with the HF rollout engine);
- train the same way: GRPO group-normalised advantages, PPO clip 0.2 (symmetric), no KL (no reference model),
  token-mean loss over the batch (TRL ``loss_type="dapo"``), one optimizer step per batch of
  ``prompts x G`` samples (no accumulation, one epoch), AdamW with a constant learning rate, weight decay 0,
  gradient clipping at 1.0, fp32, no gradient checkpointing, full fine-tuning (or LoRA on both with
  ``--lora``);
- use ``--threads`` torch threads, each in a fresh process.

Ours runs :class:`services.trainer.ray.policy_worker.PolicyWorker` (the policy worker the training loop drives: one agent,
``per_agent`` policy, HF rollout engine, :func:`services.trainer.learn.learner.update_agent`, torch strategy)
in-process, without services or Ray, as TRL runs without them. TRL runs in its own virtualenv
(``--trl-venv``, default ``~/.cache/marti-bench/trl-venv``), created on first use with ``torch==2.13.0``
installed first and pinned, plus the same transformers, peft and accelerate versions as this environment.

Throughput = samples (completions) and generated tokens per second of training wall time (generation, reward,
loss, backward, optimizer step; model loading and evaluation excluded). Reward after N steps = mean training
reward over the last ``max(1, steps // 4)`` steps, and the greedy reward of the final model on held-out
problems, scored by the same code (:func:`benchmarks.sum_task.evaluate`) for both.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import sum_task
from benchmarks.report import markdown_table, write_json

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TRL_VENV = Path.home() / ".cache" / "marti-bench" / "trl-venv"
#: Target of issue 6: our throughput at least this multiple of TRL's, at equal or better reward.
TARGET_RATIO = 1.5


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
            "engine": "hf",
            "episodes_per_step": B,
            "group_size": spec["group_size"],
            "max_new_tokens": spec["max_new_tokens"],
            "temperature": spec["temperature"],
            "top_p": 1.0,
        },
        "policy": policy,
        "strategy": {"name": "torch", "grad_clip": spec["grad_clip"], "weight_decay": 0.0},
        "output": {"log_with": []},
    }


def run_ours(spec: dict[str, Any]) -> dict[str, Any]:
    """Train with our GRPO (PolicyWorker) as the spec says; same result keys as the TRL runner.

    Returns:
        ``train_time_s``, ``step_times_s``, ``step_rewards``, ``completion_tokens``, ``prompt_tokens``,
        ``samples``, ``eval`` (see :func:`benchmarks.sum_task.evaluate`).
    """
    import torch

    from marti.config import config_from_dict
    from marti.trajectory import Trajectory, Turn
    from services.trainer.ray.policy_worker import PolicyWorker, policy_actor_config

    worker = PolicyWorker(
        policy_actor_config(config_from_dict(worker_config(spec))), num_threads=spec["threads"]
    )
    P, G = spec["prompts_per_step"], spec["group_size"]
    problems = spec["train_problems"]
    step_times, step_rewards = [], []
    counts = {"completion_tokens": 0, "prompt_tokens": 0, "samples": 0}
    t_start = time.perf_counter()
    for step in range(spec["steps"]):
        t0 = time.perf_counter()
        batch = problems[step * P : (step + 1) * P]
        chats = [sum_task.chat(p["question"]) for p in batch for _ in range(G)]
        gens = worker.generate("solver", chats)
        samples = []
        for i, g in enumerate(gens):
            turn = Turn(0, list(g.prompt_token_ids), list(g.response_token_ids))
            reward = sum_task.reward(g.text, batch[i // G]["answer"])
            samples.append(
                Trajectory(f"{step}-{i}", "solver", group_id=str(i // G), episode_return=reward, turns=[turn])
            )
            counts["completion_tokens"] += len(g.response_token_ids)
            counts["prompt_tokens"] += len(g.prompt_token_ids)
        worker.train("solver", samples)
        counts["samples"] += len(samples)
        step_rewards.append(statistics.mean(t.outcome_reward for t in samples))
        step_times.append(time.perf_counter() - t0)
    train_time = time.perf_counter() - t_start
    model = worker.policy.model("solver")
    with torch.no_grad():
        ev = sum_task.evaluate(
            model, worker.policy.tokenizer("solver"), spec["eval_problems"], spec["max_new_tokens"]
        )
    return {
        "train_time_s": train_time,
        "step_times_s": step_times,
        "step_rewards": step_rewards,
        **counts,
        "eval": ev,
    }


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


# ---------------------------------------------------------------------------------------------- report
def summarize(name: str, r: dict[str, Any], tail: int) -> dict[str, Any]:
    """Per-side numbers: samples/s, tokens/s, tail training reward, eval reward."""
    t = r["train_time_s"]
    return {
        "side": name,
        "train_s": t,
        "samples_per_s": r["samples"] / t,
        "gen_tokens_per_s": r["completion_tokens"] / t,
        "all_tokens_per_s": (r["completion_tokens"] + r["prompt_tokens"]) / t,
        "median_step_s": statistics.median(r["step_times_s"]) if r["step_times_s"] else float("nan"),
        "median_samples_per_s": (r["samples"] / len(r["step_times_s"])) / statistics.median(r["step_times_s"])
        if r["step_times_s"]
        else float("nan"),
        "tail_reward": statistics.mean(r["step_rewards"][-tail:]) if r["step_rewards"] else float("nan"),
        "tail_rewards": list(r["step_rewards"][-tail:]),
        "eval_scores": list(r["eval"].get("scores", [])),
        "first_reward": r["step_rewards"][0] if r["step_rewards"] else float("nan"),
        "eval_reward": r["eval"]["reward"],
        "eval_accuracy": r["eval"]["accuracy"],
        "mean_completion_len": r["completion_tokens"] / max(1, r["samples"]),
        "load": r.get("load", float("nan")),
    }


def reward_comparison(ours: dict[str, Any], trl: dict[str, Any]) -> tuple[bool, str]:
    """Is our reward equal to or better than TRL's, within one standard error of the difference?

    Training: the tail steps' mean rewards, difference of two means, SE = sqrt(var_o / n_o + var_t / n_t) over
    the per-step means. Held-out: both sides answer the same problems, so the difference is paired per problem,
    SE = stdev(d) / sqrt(n). "Equal or better" = each difference >= -SE (a difference inside sampling noise is
    equal; a zero SE demands >= 0).

    Returns:
        ``(ok, text)``: the verdict and a sentence with both differences and their SEs.
    """

    def se_two(a: list[float], b: list[float]) -> float:
        va = statistics.variance(a) / len(a) if len(a) > 1 else 0.0
        vb = statistics.variance(b) / len(b) if len(b) > 1 else 0.0
        return (va + vb) ** 0.5

    d_train = ours["tail_reward"] - trl["tail_reward"]
    se_train = se_two(ours["tail_rewards"], trl["tail_rewards"])
    same_problems = len(ours["eval_scores"]) == len(trl["eval_scores"])  # else older result files: no pairing
    paired = (
        [a - b for a, b in zip(ours["eval_scores"], trl["eval_scores"], strict=True)] if same_problems else []
    )
    d_eval = ours["eval_reward"] - trl["eval_reward"]
    se_eval = statistics.stdev(paired) / len(paired) ** 0.5 if len(paired) > 1 else 0.0
    ok = d_train >= -se_train and d_eval >= -se_eval
    text = (
        f"reward ours - TRL: training {d_train:+.3f} (SE {se_train:.3f}), held-out {d_eval:+.3f} "
        f"(paired SE {se_eval:.3f})"
    )
    return ok, text


def _side_cells(r: dict[str, Any]) -> list[str]:
    """One side's row of :func:`format_table`."""
    return [
        r["side"], f"{r['train_s']:.1f}", f"{r['samples_per_s']:.2f}", f"{r['gen_tokens_per_s']:.1f}",
        f"{r['all_tokens_per_s']:.1f}", f"{r['median_step_s']:.2f}", f"{r['median_samples_per_s']:.2f}",
        f"{r['mean_completion_len']:.1f}", f"{r['first_reward']:.3f}", f"{r['tail_reward']:.3f}",
        f"{r['eval_reward']:.3f} ({r['eval_accuracy']:.2f})", f"{r['load']:.1f}",
    ]  # fmt: skip


def format_table(rows: list[dict[str, Any]], init_eval: dict[str, float], steps: int, tail: int) -> str:
    """Markdown table of both sides (:func:`benchmarks.report.markdown_table`), a row of the untrained model's
    evaluation, and the ratio line."""
    header = ["side", "train s", "samples/s", "generated tok/s", "prompt+gen tok/s", "median step s",
              "samples/s at median step", "mean completion tok", "reward step 1",
              f"reward last {tail} of {steps} steps", "eval reward (acc)", "load"]  # fmt: skip
    cells = [_side_cells(r) for r in rows]
    cells.append(
        ["untrained model", *[""] * 9, f"{init_eval['reward']:.3f} ({init_eval['accuracy']:.2f})", ""]
    )
    lines = [markdown_table(header, cells, "l" + "r" * 11)]
    c = compare(rows)
    if c is not None:
        o, t = c["ours"], c["trl"]
        lines += [
            "",
            f"ours / TRL: samples/s {c['samples_per_s_ratio']:.2f}x, generated tokens/s "
            f"{c['gen_tokens_per_s_ratio']:.2f}x, at the median step {c['median_samples_per_s_ratio']:.2f}x; "
            f"reward ours {o['tail_reward']:.3f} vs TRL {t['tail_reward']:.3f} (training, last {tail} steps), "
            f"eval {o['eval_reward']:.3f} vs {t['eval_reward']:.3f}; {c['reward_text']}. "
            f"Target >= {TARGET_RATIO}x at equal or better reward (within one SE): "
            f"{'met' if c['met'] else 'NOT met'}.",
        ]
    return "\n".join(lines)


def compare(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Ours against TRL: the throughput ratios, the reward verdict and the target.

    Args:
        rows: :func:`summarize` rows (one per side).

    Returns:
        ``None`` unless both sides ran; else ``{"ours", "trl"}`` (the rows), ``samples_per_s_ratio``,
        ``gen_tokens_per_s_ratio``, ``median_samples_per_s_ratio`` (ours / TRL), ``reward_ok`` and
        ``reward_text`` (:func:`reward_comparison`), ``target_ratio`` and ``met`` (samples/s ratio >=
        :data:`TARGET_RATIO` at an equal or better reward).
    """
    by = {r["side"]: r for r in rows}
    if "ours" not in by or "trl" not in by:
        return None
    o, t = by["ours"], by["trl"]
    ratio_s = o["samples_per_s"] / t["samples_per_s"]
    reward_ok, reward_text = reward_comparison(o, t)
    return {
        "ours": o,
        "trl": t,
        "samples_per_s_ratio": ratio_s,
        "gen_tokens_per_s_ratio": o["gen_tokens_per_s"] / t["gen_tokens_per_s"],
        "median_samples_per_s_ratio": o["median_samples_per_s"] / t["median_samples_per_s"],
        "reward_ok": reward_ok,
        "reward_text": reward_text,
        "target_ratio": TARGET_RATIO,
        "met": ratio_s >= TARGET_RATIO and reward_ok,
    }


def _child(role: str, spec_path: Path, out_path: Path, python: str) -> dict[str, Any]:
    """Run one side in a fresh process; returns its result JSON with the load average added."""
    if role == "trl":
        cmd = [
            python,
            str(Path(__file__).resolve().parent / "trl_grpo_runner.py"),
            str(spec_path),
            str(out_path),
        ]
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
        0 when both sides ran (whether or not the target is met).
    """
    p = argparse.ArgumentParser(prog="marti bench trainer", description=__doc__.splitlines()[0])
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
    p.add_argument("--repeats", type=int, default=1, help="alternate ours/TRL this many times (default 1)")
    p.add_argument("--sides", nargs="+", default=["ours", "trl"], choices=["ours", "trl"])
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
    for name in ("steps", "prompts", "group", "max_new_tokens", "threads", "eval_problems", "repeats"):
        if getattr(args, name) <= 0:
            raise SystemExit(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    out = Path(args.out)
    if args.report_only:
        if not (out / "spec.json").is_file():
            raise SystemExit(f"--report-only: no earlier run in {out} (its spec.json is missing)")
        return _report(args, out)
    out.mkdir(parents=True, exist_ok=True)
    trl_python = str(ensure_trl_venv(Path(args.trl_venv))) if "trl" in args.sides else ""
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
        for side in args.sides:
            python = sys.executable if side == "ours" else trl_python
            res = _child(side, spec_path, out / f"{side}_{rep}.json", python)
            (out / f"{side}_{rep}.json").write_text(json.dumps(res))
    return _report(args, out)


def _report(args: argparse.Namespace, out: Path) -> int:
    """Print and save (``<out>/table.md``) the table of the side results ``<out>/<side>_<rep>.json``."""
    spec = json.loads((out / "spec.json").read_text())
    init_eval = json.loads((out / "init_eval.json").read_text())
    steps = spec["steps"]
    tail = max(1, steps // 4)
    results: dict[str, list[dict[str, Any]]] = {}
    for side in ("ours", "trl"):
        runs = [json.loads(f.read_text()) for f in sorted(out.glob(f"{side}_*.json"))]
        if runs:
            results[side] = runs
    if not results:
        raise SystemExit(f"no side results in {out} (ours_*.json, trl_*.json): the run did not finish a side")
    rows = []
    for side, runs in results.items():
        best = min(runs, key=lambda r: r["train_time_s"])  # least disturbed by other load on the machine
        rows.append(summarize(side, best, tail))
    reps = max(len(v) for v in results.values())
    print(
        f"\nmodel {spec.get('model', args.model)}, N={steps} steps x {spec['prompts_per_step']} prompts x "
        f"G={spec['group_size']}, "
        f"max_new_tokens={spec['max_new_tokens']}, T={spec['temperature']}, lr={spec['lr']}, "
        f"{'LoRA r=8' if spec['lora'] else 'full fine-tuning'}, {spec['threads']} threads, seed {spec['seed']}, "
        f"fastest of {reps} run(s) per side\n"
    )
    text = format_table(rows, init_eval, steps, tail)
    print(text)
    (out / "table.md").write_text(text + "\n")
    if args.json:
        c = compare(rows)
        doc = {
            "bench": "trainer",
            "spec": {k: v for k, v in spec.items() if not k.endswith("_problems")},
            "untrained_eval": init_eval,
            "sides": rows,
            "comparison": c and {k: v for k, v in c.items() if k not in ("ours", "trl")},
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        }
        write_json(args.json, doc)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
