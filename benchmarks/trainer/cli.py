"""The command line of ``marti bench trainer`` (:mod:`benchmarks.trainer`): its flags and their checks, the default
sides, and the run: the spec, the untrained model's evaluation, every side in turn (:mod:`.sides`) and the report
(:mod:`.results`); with ``--_ours``, our side (:mod:`.ours`) in this process."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.report import bench_parser, check_json_path, int_at_least, positive_float, positive_int
from benchmarks.trainer import sum_task
from benchmarks.trainer.ours import run_ours
from benchmarks.trainer.report import SIDES, TRL_ARMS
from benchmarks.trainer.results import print_report, side_files
from benchmarks.trainer.sides import ROOT, prepare_model, run_child
from benchmarks.trainer.trl_venv import DEFAULT_TRL_VENV, ensure_trl_venv

#: ``--engine`` and ``--dtype``: our side's ``rollout.engine`` and ``rollout.dtype`` (the CPU's engines).
ENGINES = ("hf", "hf_static")
DTYPES = ("float32", "bfloat16", "auto")
#: ``--train-dtype``: what our update computes in (``strategy.bf16``: bf16 autocast over float32 weights).
TRAIN_DTYPES = ("float32", "bfloat16")
#: The defaults of our side's flags, the recorded settings (``args`` attribute -> value).
OUR_DEFAULTS = {"engine": "hf", "dtype": "float32", "train_dtype": "float32"}


def main(argv: list[str] | None = None) -> int:
    """Run every side and print the comparison table (see :mod:`benchmarks.trainer`).

    Args:
        argv: Command-line arguments (see ``--help``).

    Returns:
        0 when every side ran (whether or not the target is met).
    """
    p = bench_parser("trainer", sys.modules[__package__].__doc__)
    p.add_argument("--model", default="tiny-llama", help="model name or folder (default tiny-llama)")
    p.add_argument("--steps", type=positive_int, default=12, help="training steps N (default 12)")
    p.add_argument("--prompts", type=positive_int, default=4, help="prompts per step (default 4)")
    p.add_argument(
        "--group",
        type=int_at_least(2),
        default=4,
        help="completions per prompt G, >= 2: GRPO compares a group's completions (default 4)",
    )
    p.add_argument(
        "--max-new-tokens", type=positive_int, default=16, help="max tokens per completion (default 16)"
    )
    p.add_argument(
        "--temperature", type=positive_float, default=1.0, help="sampling temperature > 0 (default 1.0)"
    )
    p.add_argument("--lr", type=positive_float, default=1e-4, help="learning rate (default 1e-4)")
    p.add_argument("--lora", action="store_true", help="LoRA (r=8, alpha=16, q/k/v/o) on both sides")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=positive_int, default=2, help="torch threads per side (default 2)")
    p.add_argument("--eval-problems", type=positive_int, default=32, help="held-out problems (default 32)")
    p.add_argument(
        "--repeats", type=positive_int, default=1, help="alternate the sides this many times (default 1)"
    )
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
    _check_args(p, args)
    out = Path(args.out)
    if args.report_only:
        if not (out / "spec.json").is_file():
            raise SystemExit(f"--report-only: no earlier run in {out} (its spec.json is missing)")
        return print_report(args, out)
    sides = args.sides or default_sides(args.dtype, args.train_dtype)
    train_problems = sum_task.make_problems(args.seed, args.steps * args.prompts)
    eval_problems = sum_task.make_problems(10_000 + args.seed, args.eval_problems)
    check_length(args.model, args.max_new_tokens, train_problems + eval_problems)
    trl_python = str(ensure_trl_venv(Path(args.trl_venv))) if set(sides) & set(TRL_ARMS) else ""
    model_dir = prepare_model(args.model, args.seed, out / "init_model")
    for old in side_files(out):  # every check passed: a new run's table holds only its own sides
        old.unlink()
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
        "train_problems": train_problems,
        "eval_problems": eval_problems,
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
            res = run_child(side, spec_path, out / f"{side}_{rep}.json", python)
            (out / f"{side}_{rep}.json").write_text(json.dumps(res))
    return print_report(args, out)


def _check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse, before any model loads, arguments a run could not honour that their argparse types do not cover
    (``args`` parsed by ``parser``; the counts, ``--group`` >= 2, the temperature and the learning rate are refused
    by :mod:`benchmarks.report`'s shared types while parsing, naming the flag and the value, exit 2).

    Raises:
        SystemExit: A side named twice; ``--engine``, ``--dtype`` or ``--train-dtype`` set away from its default
            without ``ours`` among ``--sides`` (they set only our side); a ``--json`` path that is a folder or whose
            folder does not exist or cannot be written (:func:`benchmarks.report.check_json_path`, exit 2).
    """
    if args.sides and len(set(args.sides)) != len(args.sides):
        raise SystemExit(f"--sides names a side twice: {args.sides} (use --repeats to run a side again)")
    changed = [
        f"--{k.replace('_', '-')}" for k, default in OUR_DEFAULTS.items() if getattr(args, k) != default
    ]
    if args.sides and "ours" not in args.sides and changed:
        raise SystemExit(
            f"{' '.join(changed)} set(s) only our side, which --sides {' '.join(args.sides)} leaves out"
        )
    check_json_path(parser, args.json)


def check_length(model: str, max_new_tokens: int, problems: list[dict]) -> None:
    """Refuse a ``--max-new-tokens`` whose reply, after the longest prompt of ``problems`` (:mod:`.sum_task`
    problems, in ``model``'s chat template), runs past the positions ``model`` takes (its config's
    ``max_position_embeddings``; the config and tokenizer only, no weights load).

    Raises:
        SystemExit: Prompt plus ``max_new_tokens`` exceeds the model's length, naming both numbers.
        NotFoundError: ``model`` cannot be found locally.
    """
    from services.trainer.models.loading import load_tokenizer
    from services.trainer.models.model_config import model_max_positions
    from services.trainer.rollout.engines.base import chats_to_ids

    limit = model_max_positions(model)
    chats = [sum_task.chat(p["question"]) for p in problems]
    prompt = max(len(ids) for ids in chats_to_ids(load_tokenizer(model), chats))
    if prompt + max_new_tokens > limit:
        raise SystemExit(
            f"--max-new-tokens {max_new_tokens}: the longest prompt ({prompt} tokens) plus {max_new_tokens} is "
            f"{prompt + max_new_tokens} tokens, beyond the {limit} positions of {model} (max_position_embeddings)"
        )


def default_sides(dtype: str, train_dtype: str = "float32") -> list[str]:
    """The sides a run has by default: ours and TRL in float32, plus TRL in bf16 when our side uses bf16: its
    ``rollout.dtype`` (``dtype``) resolves to bfloat16 on this CPU (``auto`` does where it has AVX512-BF16 or
    AMX), or its update computes in bfloat16 (``train_dtype``)."""
    import torch

    from services.trainer.rollout.engines.precision import resolve_rollout_dtype

    bf16 = resolve_rollout_dtype(dtype, "cpu") == torch.bfloat16 or train_dtype == "bfloat16"
    return ["ours", "trl", "trl_bf16"] if bf16 else ["ours", "trl"]
