"""TRL side of ``marti bench trainer``: GRPOTrainer on the sum task, run by the TRL virtualenv's Python.

``<trl-venv>/bin/python benchmarks/trainer/trl_runner.py SPEC.json OUT.json [fp32|bf16]``

Imports only TRL's virtualenv (trl, transformers, peft, datasets, torch, psutil), :mod:`sum_task`,
:mod:`dtype_probe` and :mod:`thread_probe` (standard library, torch and psutil; found beside this file, by path) and ``services.trainer.models.dense_head`` (torch
only, by path from the repository root), never ``marti``. It reads the run spec written by
:mod:`benchmarks.trainer` (model folder, problems, seeds, batch shape, sampling, optimizer), trains, evaluates the
final model greedily in float32 with :func:`sum_task.evaluate`, and writes ``{"train_time_s", "step_times_s",
"generation_s", "step_rewards", "completion_tokens", "prompt_tokens", "samples", "eval", "observed", "threads",
"precision", "dense_head", "versions"}`` to OUT.json (``threads``: :meth:`thread_probe.ThreadProbe.report` of every
step, generation being ``_generate_single_turn`` and the update the rest of the step, between its callbacks).

Precision (the third argument, :data:`PRECISIONS`):

- ``fp32`` (default): the model loaded in float32, ``GRPOConfig(bf16=False)``: everything in float32.
- ``bf16``: ``GRPOConfig(bf16=True)`` (TRL's own default; accelerate's bf16 autocast around the model's forward)
  and, with LoRA, the model loaded in bfloat16. Generation and the training forward and backward then compute in
  bf16 while the trained weights and AdamW's state stay float32. The load dtype differs because TRL 1.16 on the
  CPU generates *outside* the autocast when peft wraps the model (a float32 base then samples in float32), and
  inside it for a plain model: so LoRA gets a bf16 base (frozen; peft keeps the adapters float32) and full
  fine-tuning keeps float32 master weights under the autocast. The result's ``observed`` shows the dtypes each
  phase computed in (first step).

The model's LM head gets a dense input (:func:`services.trainer.models.dense_head.dense_head_input`), as ours
does: without it, PyTorch's CPU bf16 ``linear`` over transformers' ``logits_to_keep`` slice copies the head's
weight once per batch row, about 100 ms a row for SmolLM2, which TRL's bf16 LoRA generation paid at every prefill.
It is a workaround for PyTorch, not a choice of either trainer, so both sides have it; in float32 it changes nothing.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# the repository root, for services.trainer.models.dense_head
sys.path.insert(1, str(Path(__file__).resolve().parents[2]))

import sum_task  # noqa: E402
from dtype_probe import DtypeProbe  # noqa: E402
from thread_probe import ThreadProbe  # noqa: E402

from services.trainer.models.dense_head import dense_head_input  # noqa: E402

#: The TRL arms' precisions (see the module docstring).
PRECISIONS = ("fp32", "bf16")


def main(argv: list[str] | None = None) -> int:
    """Run TRL's GRPOTrainer as the spec says and write the result JSON.

    Args:
        argv: ``[SPEC.json, OUT.json]`` or ``[SPEC.json, OUT.json, PRECISION]`` (:data:`PRECISIONS`, default fp32).

    Returns:
        0 on success.

    Raises:
        SystemExit: An unknown precision (named).
    """
    args = argv if argv is not None else sys.argv[1:]
    spec_path, out_path = args[:2]
    precision = args[2] if len(args) > 2 else "fp32"
    if precision not in PRECISIONS:
        raise SystemExit(f"precision must be one of {PRECISIONS}, got {precision!r}")
    bf16 = precision == "bf16"
    spec = json.loads(Path(spec_path).read_text())
    import datasets
    import torch
    import transformers
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    torch.set_num_threads(spec["threads"])
    torch.manual_seed(spec["seed"])
    tok = AutoTokenizer.from_pretrained(spec["model_dir"])
    load_dtype = torch.bfloat16 if bf16 and spec["lora"] else torch.float32
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=load_dtype)
    dense_head = dense_head_input(model)  # as ours (module docstring)
    rows = [{"prompt": sum_task.chat(p["question"]), "answer": p["answer"]} for p in spec["train_problems"]]
    dataset = datasets.Dataset.from_list(rows)
    B = spec["prompts_per_step"] * spec["group_size"]
    step_rewards: list[float] = []
    counts = {"completion_tokens": 0, "prompt_tokens": 0, "samples": 0}

    def sum_reward(prompts, completions, answer, completion_ids=None, **_):  # noqa: ANN001
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        scores = [sum_task.reward(t, a) for t, a in zip(texts, answer, strict=True)]
        step_rewards.append(sum(scores) / len(scores))
        counts["samples"] += len(scores)
        if completion_ids is not None:
            counts["completion_tokens"] += sum(len(ids) for ids in completion_ids)
        else:
            counts["completion_tokens"] += sum(
                len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts
            )
        return scores

    step_times: list[float] = []
    gen_times: list[float] = []
    probe = DtypeProbe()
    threads = ThreadProbe()  # every step; the generation inside a step's update span pauses it

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001
            self.t0 = time.perf_counter()
            gen_times.append(0.0)
            threads.begin("update")  # what is not generation is the update
            if not step_times:
                probe.current = "update"  # step 1: what is not generation is the update

        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001
            step_times.append(time.perf_counter() - self.t0)
            threads.end()
            if len(step_times) == 1:
                probe.current = None
                probe.stop()

    peft_config = None
    if spec["lora"]:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=spec["lora_r"],
            lora_alpha=spec["lora_alpha"],
            lora_dropout=0.0,
            target_modules=spec["lora_target_modules"],
            task_type="CAUSAL_LM",
        )
    config = trl.GRPOConfig(
        output_dir=str(Path(out_path).parent / "trl_output"),
        max_steps=spec["steps"],
        per_device_train_batch_size=B,
        gradient_accumulation_steps=1,
        num_generations=spec["group_size"],
        generation_batch_size=B,
        max_completion_length=spec["max_new_tokens"],
        temperature=spec["temperature"],
        top_p=1.0,
        top_k=0,
        beta=0.0,
        epsilon=spec["clip_eps"],
        num_iterations=1,
        loss_type="dapo",  # token-level mean over the batch = our token-mean
        scale_rewards="group",
        learning_rate=spec["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=spec["grad_clip"],
        gradient_checkpointing=False,
        bf16=bf16,
        use_cpu=True,
        seed=spec["seed"],
        shuffle_dataset=False,  # same problem order as our side
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=[sum_reward],
        args=config,
        train_dataset=dataset,
        processing_class=tok,
        peft_config=peft_config,
        callbacks=[StepTimer()],
    )
    generate = trainer._generate_single_turn  # transformers generate, timed (and probed) per step

    def timed_generate(*a, **kw):  # noqa: ANN002, ANN003
        t = time.perf_counter()
        with probe.phase("generation"), threads.phase("generation"):
            out = generate(*a, **kw)
        gen_times[-1] += time.perf_counter() - t
        return out

    trainer._generate_single_turn = timed_generate
    t0 = time.perf_counter()
    trainer.train()
    train_time = time.perf_counter() - t0
    prompt_len = [
        len(
            tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True, return_dict=False)
        )
        for r in rows[: spec["steps"] * spec["prompts_per_step"]]
    ]
    counts["prompt_tokens"] = sum(prompt_len) * spec["group_size"]
    # every arm evaluates its final weights the same way: float32, no autocast wrapper
    final = trainer.accelerator.unwrap_model(trainer.model, keep_fp32_wrapper=False).float()
    ev = sum_task.evaluate(final, tok, spec["eval_problems"], spec["max_new_tokens"])
    result = {
        "train_time_s": train_time,
        "step_times_s": step_times,
        "generation_s": gen_times,
        "step_rewards": step_rewards,
        **counts,
        "eval": ev,
        "observed": probe.report(),
        "threads": threads.report(),
        "precision": precision,
        "dense_head": dense_head,
        "versions": {
            "trl": trl.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        },
    }
    Path(out_path).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
