"""TRL side of ``marti bench trainer``: GRPOTrainer on the sum task, run by the TRL virtualenv's Python.

``<trl-venv>/bin/python benchmarks/trl_grpo_runner.py SPEC.json OUT.json``

Imports only TRL's virtualenv (trl, transformers, peft, datasets, torch) and :mod:`sum_task` (standard library),
never ``marti``. It reads the run spec written by :mod:`benchmarks.trainer` (model folder, problems, seeds,
batch shape, sampling, optimizer), trains, evaluates the final model greedily with
:func:`sum_task.evaluate`, and writes ``{"train_time_s", "step_times_s", "step_rewards", "completion_tokens",
"prompt_tokens", "samples", "eval", "versions"}`` to OUT.json.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sum_task  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """Run TRL's GRPOTrainer as the spec says and write the result JSON.

    Args:
        argv: ``[SPEC.json, OUT.json]``.

    Returns:
        0 on success.
    """
    spec_path, out_path = (argv if argv is not None else sys.argv[1:])[:2]
    spec = json.loads(Path(spec_path).read_text())
    import datasets
    import torch
    import transformers
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    torch.set_num_threads(spec["threads"])
    torch.manual_seed(spec["seed"])
    tok = AutoTokenizer.from_pretrained(spec["model_dir"])
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)
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

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001
            step_times.append(time.perf_counter() - self.t0)

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
        bf16=False,
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
    ev = sum_task.evaluate(trainer.model, tok, spec["eval_problems"], spec["max_new_tokens"])
    result = {
        "train_time_s": train_time,
        "step_times_s": step_times,
        "step_rewards": step_rewards,
        **counts,
        "eval": ev,
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
