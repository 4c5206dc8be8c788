"""``marti bench trainer``: our GRPO against TRL's GRPOTrainer on one machine, same model, task, seeds.

Task: "What is a + b? Reply with only the number." (:mod:`.sum_task`; reward 1 for the right sum,
0.1 for another integer, 0 for none). Both sides:

- start from the **same weights**: the model (``--model``, default ``tiny-llama``: a 2-layer Llama with the
  SmolLM2 tokenizer, seeded) is built once and saved to ``<out>/init_model``; both load that folder;
- see the **same problems in the same order** (``--steps`` x ``--prompts`` problems, TRL's shuffling off);
- sample **G = --group** completions per prompt with the same ``max_new_tokens`` and temperature (top-p 1,
  top-k off) on the CPU: TRL with transformers ``generate`` (no vLLM), ours with the rollout engine
  ``--engine`` (``rollout.engine``: ``hf``, the default as recorded, or ``hf_static``) sampling in ``--dtype``
  (``rollout.dtype``: ``float32``, the default as recorded, ``bfloat16`` or ``auto``);
- train the same way: GRPO group-normalised advantages, PPO clip 0.2 (symmetric), no KL (no reference model),
  token-mean loss over the batch (TRL ``loss_type="dapo"``), one optimizer step per batch of
  ``prompts x G`` samples (no accumulation, one epoch), AdamW with a constant learning rate, weight decay 0,
  gradient clipping at 1.0, no gradient checkpointing, full fine-tuning (or LoRA on both with ``--lora``);
  our update computes in ``--train-dtype`` (``strategy.bf16``: ``float32``, the default as recorded, or
  ``bfloat16`` autocast over float32 weights), whatever ``--dtype`` says;
- use ``--threads`` torch threads, each in a fresh process.

TRL runs in one or two arms (``--sides``): ``trl``, all float32, and ``trl_bf16``, TRL's bf16
(``GRPOConfig(bf16=True)``; with LoRA the base loaded in bfloat16: generation and training compute in bf16,
the trained weights stay float32; :mod:`.trl_runner` says why). ``trl_bf16`` runs by default
when our side samples in bf16. Every side's first step is probed (:class:`.dtype_probe.DtypeProbe`)
and the report prints the dtypes its generation and update really computed in.

Ours runs :class:`services.trainer.ray.policy_worker.PolicyWorker` (the policy worker the training loop drives: one
agent, ``per_agent`` policy, the rollout engine above, :func:`services.trainer.learn.learner.update_agent`, torch
strategy) in-process, without services or Ray, as TRL runs without them. TRL runs in its own virtualenv
(``--trl-venv``, default ``~/.cache/marti-bench/trl-venv``), created on first use with ``torch==2.13.0``
installed first and pinned, plus the same transformers, peft and accelerate versions as this environment.

Throughput = samples (completions) and generated tokens per second of training wall time (generation, reward,
loss, backward, optimizer step; model loading and evaluation excluded). Reward after N steps = mean training
reward over the last ``max(1, steps // 4)`` steps, and the greedy reward of the final model on held-out
problems, in float32, scored by the same code (:func:`.sum_task.evaluate`) for every side. Each step
is also split into generation and the rest (the update: reward, loss, backward, optimizer step, weight sync), and
every step of every side runs under a :class:`.thread_probe.ThreadProbe`: a second table says, per side and phase,
the wall and CPU seconds per step, the cores busy, the main (Python) thread's share and the CPU per sample.

Modules: :mod:`.cli` (the flags, their checks and the run), :mod:`.sides` (the starting model, each side in a fresh
process), :mod:`.ours` (our side), :mod:`.trl_venv` and :mod:`.trl_runner` (the TRL side, in its own virtualenv),
:mod:`.sum_task`, :mod:`.dtype_probe` and :mod:`.thread_probe` (shared by both sides, standard library, torch and
psutil only), :mod:`.report` (the numbers, ratios and table), :mod:`.thread_report` (the per-thread table) and
:mod:`.results` (the run folder's results, printed and saved).
"""

from benchmarks.trainer.cli import main

__all__ = ["main"]
