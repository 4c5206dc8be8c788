"""The schema of the training config: one frozen pydantic v2 model per YAML section, :class:`TrainConfig` on top.

Every section forbids unknown keys and is immutable after validation; each field's docstring is its
documentation (rendered into ``docs/config.md`` by :mod:`marti.config.docs`). Loading and overrides live in
:mod:`marti.config.load`, the training-seed schedule in :mod:`marti.config.sections.seeds`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from marti.config.section import NAME_RE as _NAME_RE
from marti.config.section import (
    Difficulty,
    NonNegFloat,
    NonNegInt,
    PositiveFloat,
    PositiveInt,
    StrictNonNegInt,
    UnitFloat,
)
from marti.config.section import Section as _Section
from marti.config.sections.algorithm import GROUP_ESTIMATORS, AlgorithmConfig
from marti.config.sections.dataset import DATASET_ENV, DatasetConfig
from marti.config.sections.dataset_team import check_dataset_team
from marti.config.sections.gateway import ExternalConfig, GatewayConfig
from marti.config.sections.reward import RewardConfig
from marti.config.sections.rollout import RolloutConfig, VllmConfig
from marti.config.sections.seeds import epochs_done, steps_for_epochs
from marti.config.sections.workflow import (
    AllocationConfig,
    BudgetConfig,
    CurriculumConfig,
    RewardAllocConfig,
    TaskConfig,
    WorkflowConfig,
)
from marti.config.unread import unread_settings
from marti.errors import InvalidArgumentError
from marti.team.prompt_template import check_prompt_template

_BYTE_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_BYTES_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_byte_size(value: int | float | str) -> int:
    """Parse a memory size such as ``"20GB"``, ``"512MiB"``, ``"1.5G"`` or ``1073741824`` into bytes.

    Decimal units (K, KB, M, MB, G, GB, T, TB) are powers of 1000, binary units (KiB, MiB, GiB, TiB) powers
    of 1024, as in Ray and Kubernetes; a bare number is bytes.

    Args:
        value: An int or float of bytes, or a string of a number and an optional unit (case-insensitive).

    Returns:
        The size in bytes, rounded down to an int.

    Raises:
        InvalidArgumentError: The value is negative, not a number, or has an unknown unit.
    """
    if isinstance(value, bool):
        raise InvalidArgumentError(f"byte size must be a number or a string like '20GB', got {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise InvalidArgumentError(f"byte size must be >= 0, got {value!r}")
        return int(value)
    match = _BYTES_RE.match(str(value))
    if match is None or match.group(2).lower() not in _BYTE_UNITS:
        raise InvalidArgumentError(
            f"byte size {value!r} is not a number with an optional unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"
        )
    return int(float(match.group(1)) * _BYTE_UNITS[match.group(2).lower()])


class SamplingConfig(_Section):
    """Resolved sampling parameters of one agent's rollouts (see :meth:`TrainConfig.sampling_for`)."""

    temperature: NonNegFloat = 1.0
    """Softmax temperature; 0 means greedy decoding."""
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    """Nucleus sampling mass in (0, 1]; 1 disables it."""
    max_new_tokens: PositiveInt = 128
    """Most tokens generated for one turn of one agent."""


class SamplingOverrides(_Section):
    """Per-agent sampling overrides; a field left null falls back to the ``rollout`` section's value."""

    temperature: NonNegFloat | None = None
    """Overrides ``rollout.temperature`` for this agent."""
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    """Overrides ``rollout.top_p`` for this agent."""
    max_new_tokens: PositiveInt | None = None
    """Overrides ``rollout.max_new_tokens`` for this agent."""


class AgentConfig(_Section):
    """One agent of the team: the model it starts from, its role, its resources and how it samples."""

    name: str
    """Unique agent id (letters, digits, ``_ . -``; at most 64 characters), e.g. ``agent_1``."""
    pretrain_model: str
    """Model name or alias the agent starts from (resolved by the trainer's model loader, not here)."""
    role: str
    """Role in the team (``leader``, ``planner``, ``executor``, ``evaluator``, ...); shown in its prompt."""
    num_gpus: NonNegFloat = 0.0
    """GPUs reserved for this agent's actors (fractions allowed, as in Ray)."""
    num_cpus: NonNegFloat = 1.0
    """CPUs reserved for this agent's actors (as in Ray)."""
    capabilities: list[str] = Field(default_factory=list)
    """Free-text capabilities, e.g. ``[planning, coordination]``, shown where a system prompt template names
    ``{capabilities}`` (``prompt_template``, ``workflow.roles.N.system_prompt``); the built-in prompt omits them."""
    is_tuning: bool = True
    """False freezes the agent: it acts in episodes but is never updated."""
    prompt_template: str | None = None
    """System prompt template; ``{role}``, ``{name}`` and ``{capabilities}`` are filled in (``{{``, ``}}``: a
    literal brace); another placeholder (a dataset column) is refused at load. Null: built-in."""
    response_prefix: str | None = None
    """Text the agent's reply is made to start with (e.g. ``"task_1:"``): appended to the prompt after the chat
    template, so it steers the format but is not trained; the env receives prefix + generated text. A workflow
    role's ``prompt_builder`` can add a reply start for one turn after it (``marti.team.workflow.TurnPrompt``)."""
    sampling: SamplingOverrides = Field(default_factory=SamplingOverrides)
    """Per-agent overrides of the ``rollout`` sampling parameters."""
    learning_rate: PositiveFloat | None = None
    """Per-agent learning rate; null uses the top-level ``learning_rate``."""
    ref_model: str | None = None
    """Model the agent's reference policy (KL term, OpenRLHF's ``--ref_pretrain``) is loaded from: any name the
    trainer's model loader accepts (``smollm2-135m-instruct``, ``tiny-llama``, a local folder or ``.gguf``); it
    must use the agent's tokenizer. Null: the agent's initial policy (``pretrain_model``'s weights; in
    ``lora`` mode the base with adapters disabled)."""
    critic_model: str | None = None
    """Critic's base model (``gae`` only); null uses ``pretrain_model``."""
    max_staleness: StrictNonNegInt | None = None
    """This agent's staleness bound, at most ``rollout.max_staleness``: its store table's ``max_policy_lag``, so
    trajectories with a turn generated more than this many of its policy versions ago are removed by the store
    and never trained on, with their group (counted in ``<agent>/stale_dropped``). Null: the ``rollout``
    bound."""

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _NAME_RE.match(value):
            raise ValueError(f"agent name {value!r} must match {_NAME_RE.pattern}")
        return value

    @field_validator("pretrain_model", "role")
    @classmethod
    def _check_nonempty(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value

    @field_validator("prompt_template")
    @classmethod
    def _check_template(cls, value: str | None) -> str | None:
        return value if value is None else check_prompt_template(value)


class EnvironmentConfig(_Section):
    """The environment the team plays in (served by env_server, or in-process when no address is given)."""

    env_name: str = "collaborative_task_solving"
    """Registered environment id on env_server."""
    scenario: str | None = "resource_allocation"
    """Scenario of the environment; null lets the environment choose its default."""
    max_turns: PositiveInt = 10
    """Most rounds of one episode; an episode that reaches it is truncated."""
    reward_type: Literal["dense", "sparse"] = "dense"
    """``dense``: a reward every turn; ``sparse``: only at the end of the episode."""
    observation_format: Literal["natural_language", "json"] = "natural_language"
    """How observations are rendered for the agents."""
    difficulty: Difficulty | None = None
    """Problem difficulty; null lets the environment choose its default."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Extra environment-specific settings passed through to the environment unchanged."""


class RayConfig(_Section):
    """Where and how the Ray side of the trainer runs."""

    address: str | None = None
    """``null`` or ``local``: start a local Ray; ``auto``: attach to the running cluster; or ``host:port``
    / ``ray://host:port`` of a cluster."""
    num_cpus: PositiveInt | None = None
    """CPUs a local ``ray.init`` may use; null: all CPUs of the machine."""
    num_cpus_per_worker: NonNegFloat = 1.0
    """CPUs of each rollout actor, and the least a policy actor reserves (it takes its agents' ``num_cpus`` when
    larger)."""
    num_gpus_per_worker: NonNegFloat = 0.0
    """GPUs of each rollout actor, and the least a policy actor reserves (or its agents' ``num_gpus``)."""
    num_rollout_workers: NonNegInt = 0
    """Rollout actors (``services/trainer/ray/rollout_worker.py``), each with its own copy of the team's models and
    ``num_cpus_per_worker`` / ``num_gpus_per_worker``: every generate call is split across them and the policy
    actors only train; new weights are synced to them after each update. 0: the policy actors generate."""
    object_store_memory: NonNegInt | None = None
    """Ray object store size in bytes; strings like ``20GB`` or ``512MiB`` are accepted. Null: Ray's default."""
    colocate_models: bool = True
    """True: each agent's reference model (KL) and critic (GAE) live in its policy actor, which keeps one copy
    of the base weights (the default). False: one reference actor per trainable agent when
    ``algorithm.kl_coef > 0`` and one critic actor per trainable agent when ``algorithm.advantage_estimator``
    is ``gae``, each with its own placement-group bundle sized like the agent's policy bundle (its ``num_cpus``
    / ``num_gpus``, at least ``ray.num_*_per_worker``, CPUs shared out when the machine has fewer)."""

    @field_validator("object_store_memory", mode="before")
    @classmethod
    def _parse_bytes(cls, value: Any) -> Any:
        return None if value is None else parse_byte_size(value)


class PolicyConfig(_Section):
    """How the agents' policies are laid out in memory."""

    mode: Literal["auto", "lora", "per_agent", "shared"] = "auto"
    """``lora``: one LoRA adapter per agent on one shared base model; ``per_agent``: a full model per agent
    (different base models allowed); ``shared``: one policy for all agents, told apart by role prompts;
    ``auto``: ``lora`` when every agent has the same ``pretrain_model``, else ``per_agent``. The ``lora_*`` keys
    are read in ``lora`` mode only: a training config refuses other values than their defaults in the other modes
    (``marti train --unset policy.lora_r`` drops a file's value)."""
    lora_r: PositiveInt = 8
    """LoRA rank."""
    lora_alpha: PositiveFloat = 16.0
    """LoRA scaling numerator (the update is scaled by ``lora_alpha / lora_r``)."""
    lora_dropout: Annotated[float, Field(ge=0, lt=1)] = 0.0
    """Dropout on the LoRA input, in [0, 1)."""
    lora_target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Module names that get LoRA adapters."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, more time)."""
    disable_dropout: bool = False
    """Set every dropout probability of the policy, reference and critic models to 0 when they are loaded (the
    model config's ``*dropout*`` fields, dropout modules and attention dropout; OpenRLHF's
    ``--disable_dropout``), so train-mode forwards are deterministic. LoRA adapters keep ``lora_dropout``."""
    ema: bool = False
    """Keep an exponential moving average of each agent's trained weights (its LoRA adapter, or the whole model
    in ``per_agent`` / ``shared`` mode): after every optimizer step ``ema = ema_beta * ema + (1 - ema_beta) *
    weights`` (OpenRLHF's ``--enable_ema``), starting from the initial weights. Evaluations (``eval_every``,
    ``marti eval``) play with the averaged weights, training rollouts with the trained ones; checkpoints save
    the averages (``ema_<unit>.pt``). Needs a transformers engine (``rollout.engine: hf`` or ``hf_static``)
    and no rollout actors; under ZeRO-3 the averages are whole copies, updated with the weights gathered."""
    ema_beta: Annotated[float, Field(gt=0, lt=1)] = 0.992
    """EMA decay in (0, 1): the weight of the old average in each update (``policy.ema``)."""
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2"] | None = None
    """transformers attention kernel every model (policy, reference, critic) is loaded with: passed as
    ``attn_implementation=`` to ``from_pretrained`` / the model config. ``flash_attention_2`` is refused (an
    error naming it) where the ``flash_attn`` package is not installed. Null lets transformers choose."""
    share_prompt_prefix: bool = True
    """Compute a prompt that several samples repeat (the G samples of a group) once: in the transformers rollout
    engines' prefill (``hf``, and ``hf_static``'s eager loop, its CPU default; not with ``compile``) and in every
    training, reference and old-policy forward (a key/value cache gathered to the rows). Rows whose prompts start
    alike (a chain's later agent: one observation per group, then each row's own teammate message, of any length)
    compute their common first columns once instead, when that runs fewer tokens. Same numbers up to float
    rounding (with dropout on, the rows share the prompt's dropout mask; sampling in bf16 rounds differently, which
    can flip a near-tied greedy token); off gives the plain forward. Ignored with gradient checkpointing and
    for models with layers other than attention (a convolution, a recurrence); a model without rotary positions
    or with a sliding window keeps its prompts' padding where it is (rows share only what they hold in the same
    columns)."""

    @field_validator("lora_target_modules")
    @classmethod
    def _nonempty_targets(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("must list at least one module name")
        return value


class StrategyConfig(_Section):
    """How each policy is trained: plain torch or DeepSpeed ZeRO, precision, clipping."""

    name: Literal["torch", "deepspeed"] = "torch"
    """``torch``: plain torch optimizer; ``deepspeed``: DeepSpeed ZeRO (gloo on CPU)."""
    zero_stage: Annotated[int, Field(ge=0, le=3)] = 0
    """ZeRO stage 0 to 3 of the policies (``deepspeed`` only)."""
    critic_zero_stage: Annotated[int, Field(ge=0, le=3)] | None = None
    """ZeRO stage 0 to 3 of the critics' DeepSpeed engines (``gae``; ``deepspeed`` only); null uses
    ``zero_stage``."""
    bf16: bool = False
    """Train in bfloat16. On a CPU whose /proc/cpuinfo names neither ``avx512_bf16`` nor ``amx_bf16`` the bf16
    arithmetic is emulated and slower than fp32: the trainer keeps the setting and logs a warning naming
    ``strategy.bf16`` (the ``--bf16`` launch flag is ignored there)."""
    grad_clip: NonNegFloat = 1.0
    """Clip the global gradient norm to this value; 0 disables clipping."""
    weight_decay: NonNegFloat = 0.0
    """AdamW weight decay."""
    init_on_gpu: bool = False
    """Create the policy, reference and critic weights directly on the GPU (a ``torch.device`` context, or
    ``device_map`` for a local folder) instead of on the CPU and then moving them: less host memory and time at
    start. On a CPU run it changes nothing."""
    offload_reference_model: bool = False
    """Keep the reference models in CPU memory and move each to the GPU only for its forward, then back
    (OpenRLHF's ``--ref_reward_offload``): saves accelerator memory at the cost of two copies per use. On a CPU
    run it changes nothing."""

    @model_validator(mode="after")
    def _check(self) -> StrategyConfig:
        if self.name == "torch" and (self.zero_stage or self.critic_zero_stage):
            raise ValueError(
                f"strategy.zero_stage={self.zero_stage} / critic_zero_stage={self.critic_zero_stage} "
                "need strategy.name=deepspeed (strategy.name is 'torch')"
            )
        return self


class ServicesConfig(_Section):
    """Addresses of the services the trainer uses; a null address starts that service embedded."""

    broker: str | None = None
    """comm_broker address ``host:port``; null: start one locally."""
    env: str | list[str] | None = None
    """env_server address; null: start one locally. Several servers: a list or a comma-separated string of
    ``host:port``, or ``dns:///name:port`` (one server per address the name resolves to); the rollouts then
    place each new session on the server with the fewest live sessions of the job and keep it there
    (docs/environments.md, "Several env servers")."""
    store: str | None = None
    """experience_store address; null: start one locally."""
    token: str | None = None
    """Bearer token sent to every service (``MARTI_TOKEN`` is used when null)."""
    tls_ca_file: str | None = None
    """CA certificate file (PEM) for TLS to the services whose address is given (flags or this section);
    embedded services are plaintext. Null: plaintext."""
    data_dir: str | None = None
    """Data directory of embedded services; null: ``<output.dir>/services``."""
    reconnect_timeout_s: NonNegFloat = 120.0
    """How long the trainer keeps retrying a rollout or store exchange while a service restarts, seconds
    (backoff 0.5 s doubling to 10 s); 0 fails at the first outage. Also how long marti train waits for a
    given service to answer before the run folder (see "One folder, one run")."""

    @field_validator("env")
    @classmethod
    def _check_env(cls, value: str | list[str] | None) -> str | list[str] | None:
        from marti.clients.env.addresses import is_env_pool

        is_env_pool(value)  # a list or comma-separated value: every entry host:port (InvalidArgumentError)
        return value


class OutputConfig(_Section):
    """Where the run writes metrics, checkpoints and its report, and how often."""

    dir: str | None = None
    """Run directory; null: ``runs/<training_name>``."""
    save_every: NonNegInt = 0
    """Save a checkpoint every this many steps (and always after the last); 0: only at the end."""
    keep_checkpoints: PositiveInt = 2
    """Most recent checkpoints kept on disk."""
    log_every: PositiveInt = 1
    """Write the training metrics (``metrics.jsonl``, TensorBoard, wandb, the progress line's values) every this
    many steps, and always the last step (OpenRLHF's ``--logging_steps``). Evaluations and the trainer
    service's job stream are not thinned."""
    log_with: list[Literal["tensorboard", "wandb"]] = Field(default_factory=lambda: ["tensorboard"])
    """Loggers besides metrics.jsonl (which is always written): ``tensorboard``, ``wandb`` (if installed)."""
    wandb_project: str | None = None
    """wandb project; null: the ``training_name``."""
    wandb_run_name: str | None = None
    """wandb run name; null: wandb's default."""


class TrainConfig(_Section):
    """A whole training job, as written in the YAML file (ARCHITECTURE.md section 7)."""

    training_name: str
    """Name of the run; also the default output directory ``runs/<training_name>``."""
    agents: list[AgentConfig]
    """The team, one entry per agent."""
    num_agents: PositiveInt | None = None
    """Number of agents; must equal the length of ``agents`` when given (filled in when omitted)."""
    max_steps: PositiveInt = 100
    """Training steps (one rollout batch and its updates per step)."""
    micro_train_batch_size: PositiveInt = 4
    """Sequences per forward/backward pass."""
    gradient_accumulation_steps: PositiveInt = 1
    """Micro batches accumulated per optimizer step."""
    max_epochs: PositiveInt = 1
    """Passes over the training problem set: with ``rollout.num_train_seeds`` set (a finite set) and built-in
    rollouts, the job ends after ``ceil(max_epochs * num_train_seeds / problems_per_step)`` steps when that comes
    before ``max_steps`` (it logs so, and logs ``train/epoch`` every step). Null ``num_train_seeds``: no epochs,
    ``max_steps`` alone bounds the job."""
    learning_rate: PositiveFloat = 1e-5
    """Peak learning rate of the policies (numeric strings like ``2e-5`` are accepted)."""
    lr_scheduler: Literal["cosine", "linear", "constant", "constant_with_warmup", "cosine_with_min_lr"] = (
        "cosine"
    )
    """Learning rate schedule after warmup: ``cosine`` and ``linear`` decay to 0 over the run,
    ``cosine_with_min_lr`` to 0.1 x the learning rate (OpenRLHF's floor), ``constant`` and
    ``constant_with_warmup`` stay at the learning rate (both warm up when a warmup is set)."""
    lr_warmup_ratio: UnitFloat = 0.0
    """Fraction of ``max_steps`` spent in linear warmup, in [0, 1]."""
    lr_warmup_steps: NonNegInt | None = None
    """Warmup steps; overrides ``lr_warmup_ratio`` when given."""
    seed: int = 42
    """Global random seed (torch, numpy, python, sampling)."""
    device: Literal["cpu", "cuda", "auto"] = "auto"
    """Where models run; ``auto``: CUDA when available, else CPU."""
    environment: EnvironmentConfig = Field(default_factory=EnvironmentConfig)
    """The environment section."""
    ray: RayConfig = Field(default_factory=RayConfig)
    """The Ray section."""
    vllm: VllmConfig = Field(default_factory=VllmConfig)
    """The vLLM section."""
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    """The RL algorithm section."""
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    """The rollout and evaluation section."""
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    """The policy layout section."""
    strategy: StrategyConfig = Field(default_factory=StrategyConfig)
    """The training strategy section."""
    services: ServicesConfig = Field(default_factory=ServicesConfig)
    """The service addresses section."""
    output: OutputConfig = Field(default_factory=OutputConfig)
    """The output section."""
    reward_alloc: RewardAllocConfig = Field(default_factory=RewardAllocConfig)
    """The credit assignment section."""
    budget: BudgetConfig = Field(default_factory=BudgetConfig)
    """The budget section."""
    workflow: WorkflowConfig = Field(default_factory=WorkflowConfig)
    """The workflow section (who acts when, roles, custom rewards)."""
    tasks: list[TaskConfig] = Field(default_factory=list)
    """Multi-task training: the tasks and their sampling weights; empty: the ``environment`` section alone."""
    task_sampling: Literal["group", "episode"] = "group"
    """Draw a task per group of ``group_size`` episodes (``group``) or per episode (``episode``; needs a
    non-group advantage estimator)."""
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig)
    """The curriculum section."""
    allocation: AllocationConfig = Field(default_factory=AllocationConfig)
    """The priority allocation section."""
    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    """The inference gateway section (serving the policies to external agent code while the job trains)."""
    external: ExternalConfig = Field(default_factory=ExternalConfig)
    """The external episodes section (``rollout.source`` external or mixed)."""
    dataset: DatasetConfig | None = None
    """The dataset section: problems from a file, a saved folder or a hub dataset (docs/datasets.md); null: none
    (the environment's own problems)."""
    reward: RewardConfig = Field(default_factory=RewardConfig)
    """The reward section: reward functions, a remote reward server and a reward model scoring dataset problems
    (docs/datasets.md); empty: the env's rewards."""

    @field_validator("training_name")
    @classmethod
    def _check_training_name(cls, value: str) -> str:
        if not _NAME_RE.match(value):
            raise ValueError(f"training_name {value!r} must match {_NAME_RE.pattern} (it names a directory)")
        return value

    @model_validator(mode="after")
    def _check_team(self) -> TrainConfig:
        names = [a.name for a in self.agents]
        if not names:
            raise ValueError("agents must list at least one agent")
        if self.num_agents is None:
            object.__setattr__(self, "num_agents", len(names))
        elif self.num_agents != len(names):
            raise ValueError(
                f"num_agents is {self.num_agents} but agents lists {len(names)} ({', '.join(names)})"
            )
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"agent names must be distinct; repeated: {', '.join(dupes)}")
        if self.policy.mode in ("lora", "shared"):
            models = {a.pretrain_model for a in self.agents}
            if len(models) > 1:
                listing = ", ".join(f"{a.name}={a.pretrain_model}" for a in self.agents)
                raise ValueError(
                    f"policy.mode={self.policy.mode} needs one pretrain_model for all agents, got {listing}"
                )
        est = self.algorithm.advantage_estimator
        if est in GROUP_ESTIMATORS and self.rollout.group_size < 2:
            raise ValueError(
                f"algorithm.advantage_estimator={est} compares episodes within a group and needs "
                f"rollout.group_size >= 2, got {self.rollout.group_size}"
            )
        if self.rollout.engine == "vllm" and self.device == "cpu":
            raise ValueError("rollout.engine=vllm needs device cuda or auto, got device=cpu")
        if self.rollout.engine == "vllm" and self.rollout.dtype not in (None, "auto"):
            raise ValueError(
                f"rollout.dtype={self.rollout.dtype} applies to the transformers engines (hf, hf_static); "
                "vLLM samples in its own dtype: leave rollout.dtype null or auto"
            )
        if not any(a.is_tuning for a in self.agents):
            raise ValueError("every agent has is_tuning=false: nothing to train")
        if self.rollout.max_staleness > 0 and self.policy_mode == "shared":
            raise ValueError(
                f"rollout.max_staleness={self.rollout.max_staleness} needs policy.mode lora or per_agent: in shared "
                "mode every agent's update moves the one shared model, so a step is several policy versions"
            )
        scripted = {r.agent for r in self.workflow.roles if r.scripted}
        frozen = [a.name for a in self.agents if not a.is_tuning and a.name not in scripted]
        if self.policy_mode == "shared" and frozen:
            raise ValueError(
                f"policy.mode=shared acts for every agent with the one model the trainable agents update, so frozen "
                f"agents {frozen} (is_tuning=false) would change as it trains: freeze an agent with policy.mode lora "
                "or per_agent"
            )
        for i, a in enumerate(self.agents):
            if a.max_staleness is not None and a.max_staleness > self.rollout.max_staleness:
                raise ValueError(
                    f"agents.{i}.max_staleness ({a.max_staleness}, agent {a.name!r}) exceeds "
                    f"rollout.max_staleness ({self.rollout.max_staleness}), the bound the rollouts run ahead by"
                )
        return self

    @model_validator(mode="after")
    def _check_workflow_tasks(self) -> TrainConfig:
        names = [a.name for a in self.agents]
        for r in self.workflow.roles:
            if r.agent not in names:
                raise ValueError(f"workflow.roles names agent {r.agent!r}, which is not in agents {names}")
            if r.scripted and self.agent(r.agent).is_tuning:
                raise ValueError(
                    f"scripted agent {r.agent!r} must set is_tuning: false (a script is not trained)"
                )
        tasks = [t.name for t in self.tasks]
        dupes = sorted({t for t in tasks if tasks.count(t) > 1})
        if dupes:
            raise ValueError(f"task names must be distinct; repeated: {', '.join(dupes)}")
        if (
            self.task_sampling == "episode"
            and self.tasks
            and self.algorithm.advantage_estimator in GROUP_ESTIMATORS
        ):
            raise ValueError(
                f"task_sampling=episode splits groups across tasks; advantage_estimator="
                f"{self.algorithm.advantage_estimator} needs task_sampling=group"
            )
        n = len(self.tuning_agents)
        if self.allocation.enabled and n * self.allocation.min_share > 1:
            raise ValueError(
                f"allocation.min_share={self.allocation.min_share} times {n} trainable agents exceeds 1"
            )
        return self

    @model_validator(mode="after")
    def _check_unread(self) -> TrainConfig:
        """Settings the rest of the config leaves unread are refused (:func:`marti.config.unread.unread_settings`)."""
        problems = unread_settings(self)
        if problems:
            raise ValueError("\n".join(problems))
        return self

    @model_validator(mode="after")
    def _check_ema(self) -> TrainConfig:
        """``policy.ema`` evaluates on the policy actors' transformers engine: no rollout actors, no vLLM."""
        if not self.policy.ema:
            return self
        if self.ray.num_rollout_workers:
            raise ValueError(
                f"policy.ema evaluates with the averaged weights on the policy actors; ray.num_rollout_workers="
                f"{self.ray.num_rollout_workers} would evaluate on rollout actors (set it to 0)"
            )
        if self.rollout.engine == "vllm":
            raise ValueError(
                "policy.ema evaluates through a transformers engine (rollout.engine hf or hf_static); "
                "rollout.engine=vllm cannot"
            )
        return self

    @model_validator(mode="after")
    def _check_eval_samples(self) -> TrainConfig:
        """``rollout.eval_samples`` N > 1 samples: at temperature 0 for every agent its N episodes would be one."""
        n = self.rollout.eval_samples
        if n > 1 and all(self.sampling_for(a.name).temperature == 0 for a in self.agents):
            raise ValueError(
                f"rollout.eval_samples={n} samples each held-out problem {n} times, but every agent's temperature "
                "is 0 (greedy), so the samples would be the same: set rollout.temperature > 0 or eval_samples 1"
            )
        return self

    @model_validator(mode="after")
    def _dataset_seed(self) -> TrainConfig:
        """A ``dataset`` without its own ``seed`` takes the job's."""
        if self.dataset is not None and self.dataset.seed is None:
            object.__setattr__(self, "dataset", self.dataset.model_copy(update={"seed": self.seed}))
        return self

    @model_validator(mode="after")
    def _dataset_env(self) -> TrainConfig:
        """A ``dataset`` plays its rows in the ``dataset_task`` env (or a custom env by import path, which gets
        each row as its config's ``row``); the default env name switches to it. ``reward`` scorers need one."""
        if self.reward.active and self.dataset is None:
            raise ValueError("reward.functions / remote_url / model score dataset problems; set dataset.path")
        if self.dataset is None:
            return self
        env = self.environment
        if "env_name" not in env.model_fields_set:
            env = env.model_copy(update={"env_name": DATASET_ENV})
            object.__setattr__(self, "environment", env)
        if env.env_name == DATASET_ENV and self.dataset.label_key is None:
            raise ValueError(
                f"dataset.label_key is null, but the {DATASET_ENV!r} env's verifier reads every row's label: "
                "name the label column (or play the rows in a custom env by import path)"
            )
        if env.env_name != DATASET_ENV and ":" not in env.env_name:
            raise ValueError(
                f"dataset rows are played by the {DATASET_ENV!r} env or a custom env by import path; "
                f"environment.env_name is {env.env_name!r}"
            )
        if self.tasks:
            raise ValueError("dataset and tasks cannot be combined: a dataset job has one task, its rows")
        _check_dataset_reads(self)
        check_dataset_team(self)
        # no held-out split: no evaluation unless eval_every is given (then DatasetTasks.fit refuses it)
        no_eval = self.dataset.eval_path is None and self.dataset.eval_fraction is None
        if no_eval and "eval_every" not in self.rollout.model_fields_set:
            object.__setattr__(self, "rollout", self.rollout.model_copy(update={"eval_every": 0}))
        return self

    @model_validator(mode="after")
    def _gateway_agents(self) -> TrainConfig:
        """``gateway.tool_parsers`` names agents of the team."""
        names = [a.name for a in self.agents]
        unknown = sorted(set(self.gateway.tool_parsers) - set(names))
        if unknown:
            raise ValueError(f"gateway.tool_parsers names agents {unknown} that are not in the team {names}")
        return self

    @model_validator(mode="after")
    def _force_gateway(self) -> TrainConfig:
        """External episodes arrive through the gateway: ``rollout.source`` external or mixed turns it on."""
        if self.rollout.source != "builtin" and not self.gateway.enabled:
            object.__setattr__(self, "gateway", self.gateway.model_copy(update={"enabled": True}))
        return self

    @property
    def gateway_resident_versions(self) -> int:
        """Versions per agent the gateway keeps servable: ``gateway.resident_versions``, or the largest agent
        staleness bound plus 1 when null."""
        if self.gateway.resident_versions is not None:
            return self.gateway.resident_versions
        return max(self.max_staleness_for(a.name) for a in self.agents) + 1

    @property
    def builtin_episodes_per_step(self) -> int:
        """Episodes the job plays itself per step: ``rollout.episodes_per_step``, 0 with ``rollout.source:
        external``."""
        return 0 if self.rollout.source == "external" else self.rollout.episodes_per_step

    @property
    def external_episodes_per_step(self) -> int:
        """External episodes each update takes per agent: ``external.episodes_per_step``, 0 with
        ``rollout.source: builtin``."""
        return 0 if self.rollout.source == "builtin" else self.external.episodes_per_step

    @property
    def items_per_step(self) -> int:
        """Items each trainable agent's update takes from its table: built-in plus external episodes."""
        return self.builtin_episodes_per_step + self.external_episodes_per_step

    @property
    def epoch_steps(self) -> int | None:
        """Steps that make ``max_epochs`` passes over the finite training problem set, or None without one.

        None when ``rollout.num_train_seeds`` is null or the job plays no built-in rollouts (``rollout.source:
        external``); else :func:`marti.config.sections.seeds.steps_for_epochs`.
        """
        if self.builtin_episodes_per_step == 0:
            return None
        r = self.rollout
        return steps_for_epochs(self.max_epochs, r.problems_per_step, r.num_train_seeds)

    @property
    def total_steps(self) -> int:
        """Steps the job runs: ``max_steps``, or :attr:`epoch_steps` when ``max_epochs`` comes first."""
        epochs = self.epoch_steps
        return self.max_steps if epochs is None else min(self.max_steps, epochs)

    def epoch_at(self, steps: int) -> float | None:
        """Passes over the training problem set after ``steps`` steps (fractional), or None without epochs."""
        if self.epoch_steps is None:
            return None
        return epochs_done(steps, self.rollout.problems_per_step, self.rollout.num_train_seeds)

    @property
    def run_dir(self) -> Path:
        """Output directory of the run: ``output.dir``, or ``runs/<training_name>``."""
        return Path(self.output.dir) if self.output.dir else Path("runs") / self.training_name

    @property
    def policy_mode(self) -> Literal["lora", "per_agent", "shared"]:
        """``policy.mode`` with ``auto`` resolved (``lora`` if all agents share one base model)."""
        if self.policy.mode != "auto":
            return self.policy.mode
        return "lora" if len({a.pretrain_model for a in self.agents}) == 1 else "per_agent"

    @property
    def tuning_agents(self) -> list[str]:
        """Names of the agents that are trained (``is_tuning: true``), in config order."""
        return [a.name for a in self.agents if a.is_tuning]

    @property
    def warmup_steps(self) -> int:
        """Warmup steps: ``lr_warmup_steps`` if given, else ``round(lr_warmup_ratio * max_steps)``."""
        if self.lr_warmup_steps is not None:
            return self.lr_warmup_steps
        return round(self.lr_warmup_ratio * self.max_steps)

    def agent(self, name: str) -> AgentConfig:
        """The agent entry called ``name``.

        Raises:
            InvalidArgumentError: No agent has that name (the message lists the agents).
        """
        for a in self.agents:
            if a.name == name:
                return a
        raise InvalidArgumentError(f"no agent {name!r}; agents are {[a.name for a in self.agents]}")

    def sampling_for(self, name: str) -> SamplingConfig:
        """Sampling parameters of agent ``name``: its overrides on top of the ``rollout`` defaults."""
        o = self.agent(name).sampling
        r = self.rollout
        return SamplingConfig(
            temperature=r.temperature if o.temperature is None else o.temperature,
            top_p=r.top_p if o.top_p is None else o.top_p,
            max_new_tokens=r.max_new_tokens if o.max_new_tokens is None else o.max_new_tokens,
        )

    def max_staleness_for(self, name: str) -> int:
        """Staleness bound of agent ``name``: its own ``max_staleness`` or ``rollout.max_staleness``."""
        own = self.agent(name).max_staleness
        return self.rollout.max_staleness if own is None else own

    def learning_rate_for(self, name: str) -> float:
        """Learning rate of agent ``name``: its own ``learning_rate`` or the top-level one."""
        lr = self.agent(name).learning_rate
        return self.learning_rate if lr is None else lr


#: ``environment`` keys that only the built-in scenarios read: a dataset job's env (``dataset_task``, or a custom
#: env by import path, which gets each row) reads ``environment.max_turns`` and ``environment.options`` alone.
_SCENARIO_KEYS = ("scenario", "difficulty", "reward_type", "observation_format")


def _check_dataset_reads(cfg: TrainConfig) -> None:
    """Refuse what a dataset job would accept and not read: a scenario key of ``environment`` set to another
    value than its default (a saved config, which writes every default, loads again), or
    ``curriculum.enabled`` (rows have no difficulty levels), so a setting never does nothing silently.

    Raises:
        ValueError: naming the key and what a dataset job reads instead.
    """
    defaults = EnvironmentConfig()
    unread = [k for k in _SCENARIO_KEYS if getattr(cfg.environment, k) != getattr(defaults, k)]
    if unread:
        raise ValueError(
            f"environment.{unread[0]} is not read by a dataset job: its problems are the dataset's rows, and its "
            "env reads environment.max_turns and environment.options alone; remove the key"
        )
    if cfg.curriculum.enabled:
        raise ValueError(
            "curriculum.enabled: a dataset job's rows have no difficulty levels to climb; remove the curriculum "
            "section (or split the rows into files and train on them in turn)"
        )
