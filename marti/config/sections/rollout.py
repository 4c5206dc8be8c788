"""The ``rollout`` and ``vllm`` sections of the training config: how episodes are generated (engine, batch shape,
sampling, held-out evaluation, staleness) and the vLLM engines' settings. Part of :mod:`marti.config.schema`."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from marti.config.section import NonNegFloat, NonNegInt, PositiveInt, StrictNonNegInt
from marti.config.section import Section as _Section
from marti.config.sections.seeds import default_eval_seeds, train_seeds


class VllmConfig(_Section):
    """vLLM rollout engine settings (used when ``rollout.engine`` resolves to ``vllm``)."""

    num_engines: PositiveInt = 1
    """vLLM engines each actor that generates builds (each ``tensor_parallel_size`` GPUs and up to
    ``gpu_memory_utilization`` of their memory; engine ``i`` seeded ``seed + i``): every generate call's prompts
    are split into contiguous chunks, one per engine, generated concurrently and joined in order
    (``services/trainer/rollout/engines/pool.py``). Weight updates go to every engine. The transformers engine is always
    one."""
    tensor_parallel_size: PositiveInt = 1
    """GPUs per engine (tensor parallelism)."""
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.9
    """Fraction of GPU memory an engine may take, in (0, 1]."""
    max_num_batched_tokens: PositiveInt = 4096
    """Most tokens in one engine batch."""
    max_num_seqs: PositiveInt = 256
    """Most sequences in one engine batch."""
    enable_prefix_caching: bool = False
    """Reuse the KV cache of shared prompt prefixes."""


class RolloutConfig(_Section):
    """How episodes are generated: engine, batch shape, sampling and held-out evaluation."""

    engine: Literal["hf", "hf_static", "vllm", "auto"] = "auto"
    """``hf``: transformers ``generate``; ``hf_static``: transformers with the engine's own decode loop over a
    preallocated key/value cache (finished rows leave the batch; on CUDA, decode steps compiled with CUDA graphs, not yet
    run on a GPU; greedy outputs equal ``hf``'s, see docs/models.md); ``vllm``: vLLM (GPU); ``auto``: ``hf_static`` on the CPU (the
    faster there, docs/benchmarks.md "Rollout engines"), vLLM on CUDA when installed, else ``hf``."""
    dtype: Literal["auto", "float32", "bfloat16"] | None = None
    """What the transformers engines (``hf``, ``hf_static``) sample in; training keeps the policy's dtype. A dtype
    other than the policy's makes the engine sample with a converted copy of the weights, refreshed at every weight
    sync, and the behaviour log-probabilities are that copy's (``tis_cap`` corrects the mismatch).
    ``bfloat16`` is faster than ``float32`` on a CPU with native bf16 (AVX512-BF16 or AMX; docs/benchmarks.md
    "Rollout engines") and slow on one without. ``auto``: on a CPU ``bfloat16`` where /proc/cpuinfo shows
    ``avx512_bf16`` or ``amx_bf16``, else ``float32``; on a GPU the policy's dtype. null (default): the policy's
    dtype, no copy (bf16 changes every CPU job's sampled draws; see docs/models.md). vLLM takes only null or
    ``auto``."""
    merge_adapters: StrictNonNegInt = 1
    """With ``policy.mode: lora`` and a ``dtype`` other than the policy's, a transformers engine samples each
    agent's adapter from a plain copy of the base with that adapter merged into its linears (re-merged at every
    weight sync) when the agents use at most this many adapters; else from one unmerged copy that switches
    adapters per call. Memory: one base copy in the sampling dtype per merged adapter. Default 1 (a lone adapter
    merges at the memory of the unmerged copy); 0: never merge. See docs/models.md. A training config refuses another
    value than 1 where nothing merges: ``policy.mode`` not ``lora``, ``dtype`` null, or ``engine: vllm``."""
    source: Literal["builtin", "external", "mixed"] = "builtin"
    """Where each update's training episodes come from. ``builtin``: the job plays ``episodes_per_step``
    episodes in the env per step. ``external``: no built-in rollout; each trainable agent's update takes
    ``external.episodes_per_step`` episodes that external agent code played through the inference gateway and
    reported rewards for (waiting up to ``external.wait_timeout_s`` for them). ``mixed``: both, the built-in
    episodes plus ``external.episodes_per_step`` more per agent. ``external`` and ``mixed`` turn the gateway on.
    Evaluation (``eval_every``) still plays the env's held-out seeds; set it to 0 for a job without an env."""
    episodes_per_step: PositiveInt = 8
    """Episodes played per training step (a multiple of ``group_size``), at once, one env session each. An
    evaluation's episodes (``eval_episodes`` x ``eval_samples``, for each task) are open sessions too, at the same
    time as a step's when ``max_staleness`` >= 1 plays the next step during the evaluation: more at once than the
    env server holds (the job's own server's ``max_sessions``, 1024 unless ``MARTI_ENV_MAX_SESSIONS`` says
    otherwise; a single given server's, read from it) is refused by ``marti train`` before anything starts."""
    group_size: PositiveInt = 4
    """Episodes per problem seed; a group is what GRPO-style estimators normalise over."""
    max_new_tokens: PositiveInt = 128
    """Default most tokens per agent turn. One that leaves no room for a prompt in the rollout engine's length
    (the model's ``max_position_embeddings``) is refused by ``marti train`` before anything starts, naming the
    agent."""
    temperature: NonNegFloat = 1.0
    """Default sampling temperature; 0 is greedy."""
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    """Default nucleus sampling mass in (0, 1]."""
    train_seed_start: NonNegInt = 0
    """First training problem seed; step ``s`` plays seeds from ``train_seed_start`` upward."""
    num_train_seeds: PositiveInt | None = None
    """Size of the training problem set (one epoch of ``max_epochs``); null: a fresh seed every problem."""
    eval_every: NonNegInt = 10
    """Evaluate on the held-out seeds every this many steps (and after the last); 0 disables evaluation. A
    ``dataset`` without a held-out split (``eval_path`` / ``eval_fraction``) has none to evaluate: 0 unless set."""
    eval_episodes: PositiveInt = 16
    """Held-out episodes per evaluation."""
    eval_samples: PositiveInt = 1
    """Episodes per held-out problem at each evaluation: 1 plays each greedily; N > 1 samples each N times (at
    each agent's sampling temperature, not 0 for every agent; ``eval_episodes`` x N episodes) and adds
    ``team/pass@k`` for k = 1..N (the unbiased estimator of Chen et al. 2021) and ``team/majority_vote`` (the
    most common team answer, dataset jobs) to the evaluation's metrics."""
    eval_seeds: list[NonNegInt] | None = None
    """Held-out problem seeds; null: ``1000000, 1000001, ...`` (``eval_episodes`` of them)."""
    max_staleness: StrictNonNegInt = 0
    """Asynchronous rollouts: most policy versions a generated turn may lag behind the weights it is trained
    with. 0 is the synchronous loop (play a step, then train on it). k >= 1 plays step ``t`` in a background
    thread as soon as the learner has finished update ``t - k``, overlapping rollouts with updates; episodes
    go to the agents' store tables as they end and the learner samples them from there
    (``services/trainer/data/episode_writer.py``, ``services/trainer/data/batch_reader.py``). The rollout
    engine then keeps its own copy of the weights (or rollout actors generate). Agents can set a tighter bound (``agents[i].max_staleness``), kept by their
    table's ``max_policy_lag``. Not with ``policy.mode: shared``, where one step is several versions of the
    one model."""
    tis_cap: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    """Truncated importance sampling against the train/rollout mismatch (engine vs learner numerics, bf16,
    vLLM) and the lag: null (default) takes the PPO ratio against the behaviour log-probabilities the sampler
    recorded; C > 0 takes it against the learner's own log-probabilities before the update and weights each
    token's loss by ``min(pi_learner / pi_behaviour, C)`` (AReaL's decoupled objective with verl's TIS; see
    docs/algorithms.md, "Off-policy correction")."""

    @model_validator(mode="after")
    def _check(self) -> RolloutConfig:
        if self.episodes_per_step % self.group_size:
            raise ValueError(
                f"rollout.episodes_per_step ({self.episodes_per_step}) must be a multiple of "
                f"rollout.group_size ({self.group_size})"
            )
        seeds = self.eval_seeds
        if seeds is not None:
            if len(set(seeds)) != len(seeds):
                raise ValueError(f"rollout.eval_seeds has duplicates: {seeds}")
            if len(seeds) < self.eval_episodes:
                raise ValueError(
                    f"rollout.eval_episodes ({self.eval_episodes}) exceeds the {len(seeds)} rollout.eval_seeds"
                )
        if self.num_train_seeds is not None:
            lo, hi = self.train_seed_start, self.train_seed_start + self.num_train_seeds
            clash = sorted(s for s in self.resolved_eval_seeds if lo <= s < hi)
            if clash:
                raise ValueError(
                    f"held-out rollout.eval_seeds {clash[:5]} overlap the training seeds [{lo}, {hi})"
                )
        return self

    @property
    def resolved_eval_seeds(self) -> list[int]:
        """The ``eval_episodes`` held-out seeds an evaluation plays, in order."""
        if self.eval_seeds is not None:
            return list(self.eval_seeds[: self.eval_episodes])
        return default_eval_seeds(self.eval_episodes)

    @property
    def problems_per_step(self) -> int:
        """Distinct problem seeds per step: ``episodes_per_step // group_size``."""
        return self.episodes_per_step // self.group_size

    def train_seeds(self, step: int) -> list[int]:
        """Problem seeds of the episodes of training step ``step`` (0-based), each repeated ``group_size`` times.

        See :func:`marti.config.sections.seeds.train_seeds` (the schedule: problem ``k`` overall has seed
        ``train_seed_start + k``, wrapped modulo ``num_train_seeds`` when the set is finite, held-out seeds
        skipped when it is unbounded).

        Raises:
            InvalidArgumentError: ``step`` is negative.
        """
        return train_seeds(
            step,
            problems_per_step=self.problems_per_step,
            group_size=self.group_size,
            train_seed_start=self.train_seed_start,
            num_train_seeds=self.num_train_seeds,
            held_out=self.resolved_eval_seeds,
        )
