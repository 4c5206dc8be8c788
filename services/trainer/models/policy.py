"""Multi-agent policies: one model per agent, one shared model with role prompts, or a LoRA adapter per agent.

Modes (``PolicyLayout.mode``):

- ``per_agent``: every agent loads its own ``pretrain_model`` (heterogeneous base models allowed); each trainable
  agent also keeps a frozen reference copy.
- ``shared``: one model acts for every agent; agents differ only by their role prompt (a system message, see
  :meth:`MultiAgentPolicy.chat`). Every agent must name the same ``pretrain_model``. One frozen reference copy.
- ``lora``: one base model in memory, one peft LoRA adapter per agent (switched per call). The reference policy
  is the base with adapters disabled, so no extra copy is kept.

Frozen agents (``is_tuning=False``) act but do not train: :meth:`parameters` returns nothing for them and their
log-probabilities carry no gradient. Several agents can share one set of trainable weights (``shared`` mode);
:meth:`unit_of` names that set so a learner builds one optimizer per unit.

Shapes: B batch, T tokens of a whole sequence, A response (action) tokens = the last A positions of T.
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from marti.errors import FailedPreconditionError, InvalidArgumentError, NotFoundError
from services.trainer.models import lean_training
from services.trainer.models.loading import (
    construction_device,
    load_model,
    load_tokenizer,
    offloaded,
    same_vocabulary,
    zero_dropout,
)
from services.trainer.models.prefix_sharing import response_logits
from services.trainer.models.token_logprobs import token_logprobs
from services.trainer.models.training_attention import training_attention
from services.trainer.models.weights_file import load_weights, save_weights

PolicyMode = Literal["per_agent", "shared", "lora"]
_NAME_RE = re.compile(r"^[A-Za-z0-9_\-]{1,64}$")


@dataclass(frozen=True)
class AgentSpec:
    """One agent of the team.

    Attributes:
        name: Unique id, 1-64 chars of letters, digits, ``_`` or ``-``.
        pretrain_model: Model name for :func:`services.trainer.models.loading.load_model`.
        is_tuning: False: the agent acts but never trains.
        role: Role prompt (system message) used by :meth:`MultiAgentPolicy.chat`; empty for none.
        ref_model: Model the agent's reference policy (KL) is loaded from (``agents.N.ref_model``); None: the
            initial policy (a copy of ``pretrain_model``'s weights, or the LoRA base with adapters disabled).
            It must share the agent's tokenizer.
    """

    name: str
    pretrain_model: str
    is_tuning: bool = True
    role: str = ""
    ref_model: str | None = None


@dataclass(frozen=True)
class LoraSettings:
    """LoRA adapter shape (peft ``LoraConfig``).

    Attributes:
        r: Rank, > 0.
        alpha: Scaling numerator, > 0 (``policy.lora_alpha``, not rounded: 2.5 is 2.5); the update is
            ``(alpha / r) * B @ A``.
        dropout: Dropout on the adapter input, in [0, 1).
        target_modules: Module names that get adapters.
    """

    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(frozen=True)
class PolicyLayout:
    """How a team's policies are built (from the config's ``policy`` section, :class:`marti.config.PolicyConfig`,
    and its agents, by :func:`services.trainer.ray.policy_worker.policy_layout`).

    Attributes:
        mode: ``per_agent``, ``shared`` or ``lora``.
        agents: The agents, at least one, unique names.
        lora: Adapter shape (``lora`` mode only).
        seed: Initialisation seed (tiny models, LoRA adapters).
        gradient_checkpointing: Trade compute for activation memory in trainable models.
        keep_reference: Keep a reference policy for KL (``per_agent``/``shared`` keep a frozen copy).
        share_prompt_prefix: Run a prompt that several rows of a batch repeat (a GRPO group), or the first
            columns that rows' prompts have in common when that runs fewer tokens, through the model once in
            log-probability forwards (:mod:`services.trainer.models.prefix_sharing`; models with gradient
            checkpointing on, or with layers other than attention, always take the plain forward; a model without
            rotary positions or with a sliding window shares only what rows hold in the same columns).
        attn_implementation: transformers attention kernel every model is loaded with (``eager``, ``sdpa``,
            ``flash_attention_2``; ``policy.attn_implementation``); None: transformers' default.
        disable_dropout: Set every dropout probability of the loaded models (policies and references) to 0
            (``policy.disable_dropout``); LoRA adapters keep ``lora.dropout``.
        init_on_gpu: Create the default loader's models directly on an accelerator ``device`` instead of on the
            CPU first (``strategy.init_on_gpu``; nothing changes on the CPU).
        offload_reference: Keep the reference copies (and ``ref_model`` references) on the CPU and move each to
            the device only for its forward (``strategy.offload_reference_model``; nothing changes on the CPU).
    """

    mode: PolicyMode
    agents: tuple[AgentSpec, ...]
    lora: LoraSettings = field(default_factory=LoraSettings)
    seed: int = 0
    gradient_checkpointing: bool = False
    keep_reference: bool = True
    share_prompt_prefix: bool = True
    attn_implementation: str | None = None
    disable_dropout: bool = False
    init_on_gpu: bool = False
    offload_reference: bool = False

    def __post_init__(self) -> None:
        """Validate; raises InvalidArgumentError naming the bad field and value."""
        if self.mode not in ("per_agent", "shared", "lora"):
            raise InvalidArgumentError(f"policy mode must be per_agent, shared or lora, got {self.mode!r}")
        object.__setattr__(self, "agents", tuple(self.agents))
        if not self.agents:
            raise InvalidArgumentError("a policy needs at least one agent, got none")
        names = [a.name for a in self.agents]
        for n in names:
            if not isinstance(n, str) or not _NAME_RE.match(n):
                raise InvalidArgumentError(f"agent name {n!r} must match {_NAME_RE.pattern}")
        if len(set(names)) != len(names):
            raise InvalidArgumentError(f"agent names must be unique, got {names}")
        if self.mode in ("shared", "lora"):
            bases = {a.pretrain_model for a in self.agents}
            if len(bases) != 1:
                raise InvalidArgumentError(
                    f"mode {self.mode!r} needs one pretrain_model for every agent, got {sorted(bases)}"
                )
        if self.lora.r <= 0:
            raise InvalidArgumentError(f"lora.r must be > 0, got {self.lora.r}")
        if not 0.0 <= self.lora.dropout < 1.0:
            raise InvalidArgumentError(f"lora.dropout must be in [0, 1), got {self.lora.dropout}")


class MultiAgentPolicy:
    """The trainable policies of a team, behind one API the training loop uses.

    Args:
        config: The :class:`PolicyLayout`.
        model_loader: ``(name, tokenizer, seed) -> model``; defaults to :func:`load_model` (creating the weights
            on :func:`~services.trainer.models.loading.construction_device`).
        device: Where models live (default CPU); offloaded references live on :attr:`offload_device` between
            forwards.

    Raises:
        InvalidArgumentError: Invalid config.
        NotFoundError: A model cannot be found locally.
    """

    def __init__(self, config: PolicyLayout, *, device: str | torch.device = "cpu", model_loader: Any = None):
        self.config = config
        self.device = torch.device(device)
        self.offload_device = torch.device("cpu")
        attn = config.attn_implementation
        build_on = construction_device(config.init_on_gpu, self.device)
        loader = model_loader or (
            lambda name, tok, seed: load_model(
                name, tokenizer=tok, seed=seed, attn_implementation=attn, device=build_on
            )
        )
        self._loader = loader
        self._specs = {a.name: a for a in config.agents}
        self._tokenizers: dict[str, Any] = {}
        self._models: dict[str, torch.nn.Module] = {}
        self._refs: dict[str, torch.nn.Module] = {}
        self._adapters: dict[str, str] = {}
        self._sync_params: dict[str, tuple[tuple[str, torch.nn.Parameter], ...] | None] = {}
        """agent -> its adapter's parameters under peft's state-dict keys, found once (:func:`_adapter_state_params`);
        None where some value is not a parameter (peft's function then runs at every call)."""
        self._versions = {a.name: 0 for a in config.agents}
        self._share_prefix = config.share_prompt_prefix
        self.lean_training = True
        """Let :meth:`logprobs` with grad run :mod:`~services.trainer.models.lean_training`'s forward where it applies
        (off: always the transformers forward; the same function, for A/B measurements)."""
        tok_cache: dict[str, Any] = {}
        for a in config.agents:
            self._tokenizers[a.name] = tok_cache.setdefault(
                a.pretrain_model, load_tokenizer(a.pretrain_model)
            )
        if config.mode == "per_agent":
            for i, a in enumerate(config.agents):
                self._models[a.name] = self._prepare(
                    loader(a.pretrain_model, self._tokenizers[a.name], config.seed + i)
                )
        else:
            first = config.agents[0]
            base = self._prepare(loader(first.pretrain_model, self._tokenizers[first.name], config.seed))
            if config.mode == "lora":
                base = self._wrap_lora(base)
            for a in config.agents:
                self._models[a.name] = base
        self._build_references()
        self._apply_trainability()

    # ----------------------------------------------------------------------------------------------- build
    def _prepare(self, model: torch.nn.Module) -> torch.nn.Module:
        if self.config.disable_dropout:
            zero_dropout(model)
        model.to(self.device)
        if self.config.gradient_checkpointing:
            model.gradient_checkpointing_enable()
            if self.config.mode == "lora":
                model.enable_input_require_grads()
        return model

    def _wrap_lora(self, base: torch.nn.Module) -> torch.nn.Module:
        from peft import LoraConfig, get_peft_model

        lcfg = self.config.lora
        peft_cfg = LoraConfig(
            r=lcfg.r,
            lora_alpha=lcfg.alpha,
            lora_dropout=lcfg.dropout,
            target_modules=list(lcfg.target_modules),
            task_type="CAUSAL_LM",
        )
        model = None
        for i, a in enumerate(self.config.agents):
            name = f"agent{i}"
            self._adapters[a.name] = name
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.config.seed + 1000 + i)
                if model is None:
                    model = get_peft_model(base, peft_cfg, adapter_name=name)
                else:
                    model.add_adapter(name, peft_cfg)
        assert model is not None
        return model.to(self.device)

    def _build_references(self) -> None:
        """The frozen reference policy of each trainable agent: its ``ref_model`` when it names another model
        than ``pretrain_model``, else a copy of its initial model (``lora``: none, the base with adapters
        disabled is the reference). Offloaded references are kept on :attr:`offload_device`."""
        if not self.config.keep_reference:
            return
        memo: dict[Any, torch.nn.Module] = {}
        home = self.offload_device if self.config.offload_reference else self.device
        for i, a in enumerate(self.config.agents):
            if not a.is_tuning:
                continue
            if a.ref_model is not None and a.ref_model != a.pretrain_model:
                key: Any = ("ref_model", a.ref_model)
                if key not in memo:
                    same_vocabulary(a.pretrain_model, a.ref_model)
                    seed = self.config.seed + i if self.config.mode == "per_agent" else self.config.seed
                    ref = self._loader(a.ref_model, self._tokenizers[a.name], seed)
                    if self.config.disable_dropout:
                        zero_dropout(ref)
                    memo[key] = ref
            elif self.config.mode == "lora":
                continue
            else:
                key = id(self._models[a.name])
                if key not in memo:
                    memo[key] = copy.deepcopy(self._models[a.name])
            ref = memo[key].to(home).eval()
            ref.requires_grad_(False)
            self._refs[a.name] = ref

    def _reference_forward(self, ref: torch.nn.Module) -> Any:
        """Context of one reference forward: with ``offload_reference`` the model is moved to :attr:`device`
        for it and back to :attr:`offload_device` after (:func:`~services.trainer.models.loading.offloaded`)."""
        if not self.config.offload_reference:
            return contextlib.nullcontext(ref)
        return offloaded(ref, self.device, self.offload_device)

    def _apply_trainability(self) -> None:
        """Set ``requires_grad``: trainable agents' weights (or adapters) on, everything else off."""
        if self.config.mode == "lora":
            trainable_adapters = {self._adapters[a] for a in self.trainable_agents}
            for name, p in self._models[self.agent_ids[0]].named_parameters():
                adapter = _adapter_of(name)
                p.requires_grad_(adapter is not None and adapter in trainable_adapters)
            return
        for a in self.config.agents:
            model = self._models[a.name]
            trains = any(b.is_tuning for b in self.config.agents if self._models[b.name] is model)
            model.requires_grad_(trains)

    # ----------------------------------------------------------------------------------------------- API
    @property
    def agent_ids(self) -> list[str]:
        """Every agent, in config order."""
        return [a.name for a in self.config.agents]

    @property
    def trainable_agents(self) -> list[str]:
        """Agents with ``is_tuning`` true, in config order."""
        return [a.name for a in self.config.agents if a.is_tuning]

    def _check(self, agent_id: str) -> AgentSpec:
        if agent_id not in self._specs:
            raise NotFoundError(f"unknown agent {agent_id!r}; agents are {self.agent_ids}")
        return self._specs[agent_id]

    def unit_of(self, agent_id: str) -> str:
        """Name of the set of trainable weights the agent updates (``"shared"`` in shared mode, else the agent)."""
        self._check(agent_id)
        return "shared" if self.config.mode == "shared" else agent_id

    def tokenizer(self, agent_id: str) -> Any:
        """The agent's tokenizer (left padding)."""
        self._check(agent_id)
        return self._tokenizers[agent_id]

    def model(self, agent_id: str) -> torch.nn.Module:
        """The agent's live module (the peft model in ``lora`` mode)."""
        self._check(agent_id)
        return self._models[agent_id]

    def chat(self, agent_id: str, messages: Sequence[Mapping[str, str]]) -> list[dict[str, str]]:
        """Prepend the agent's role prompt as a system message (unless ``messages`` starts with one)."""
        spec = self._check(agent_id)
        msgs = [dict(m) for m in messages]
        if spec.role and not (msgs and msgs[0].get("role") == "system"):
            msgs.insert(0, {"role": "system", "content": spec.role})
        return msgs

    def rollout_target(self, agent_id: str) -> tuple[torch.nn.Module, Any, str | None]:
        """(module, tokenizer, adapter name or None) that a rollout engine samples the agent with."""
        self._check(agent_id)
        return self._models[agent_id], self._tokenizers[agent_id], self._adapters.get(agent_id)

    def _activate(self, agent_id: str) -> torch.nn.Module:
        model = self._models[agent_id]
        if self.config.mode == "lora":
            model.base_model.set_adapter(self._adapters[agent_id])
            self._apply_trainability()  # peft's set_adapter flips requires_grad; restore ours
        return model

    def parameters(self, agent_id: str) -> list[torch.nn.Parameter]:
        """Trainable parameters of the agent (its adapter in ``lora`` mode); empty for frozen agents."""
        spec = self._check(agent_id)
        if not spec.is_tuning:
            return []
        model = self._models[agent_id]
        if self.config.mode == "lora":
            name = self._adapters[agent_id]
            return [p for n, p in model.named_parameters() if _adapter_of(n) == name]
        return [p for p in model.parameters() if p.requires_grad]

    def named_parameters(self, agent_id: str) -> Iterator[tuple[str, torch.nn.Parameter]]:
        """Like :meth:`parameters`, with names (for optimizers that need them)."""
        keep = {id(p) for p in self.parameters(agent_id)}
        for n, p in self._models[agent_id].named_parameters():
            if id(p) in keep:
                yield n, p

    def logprobs(
        self,
        agent_id: str,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        action_mask: torch.Tensor,
        *,
        return_entropy: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Log-probabilities of the last A tokens under the agent's policy, with grad for trainable agents.

        ``logp[b, j] = log softmax(z)[y]`` where ``y = input_ids[b, T - A + j]`` and ``z`` the logits at the
        position before it (temperature 1, the rollout engines' convention). Positions follow the attention
        mask, so left padding gives the same numbers as generation.

        Args:
            agent_id: The agent.
            input_ids: (B, T) int64.
            attention_mask: (B, T) 0/1.
            action_mask: (B, A) with 1 <= A < T; only its shape is used here (losses apply the mask).
            return_entropy: Also return the entropy of each predicted distribution, (B, A).

        Returns:
            (B, A) float32 log-probabilities, or (logprobs, entropy).

        Raises:
            NotFoundError: Unknown agent.
            InvalidArgumentError: Shapes disagree, or A not in [1, T).
        """
        spec = self._check(agent_id)
        model = self._activate(agent_id)
        with torch.set_grad_enabled(spec.is_tuning and torch.is_grad_enabled()):
            return _sequence_logprobs(
                model,
                input_ids,
                attention_mask,
                action_mask,
                return_entropy,
                self._share_prefix,
                self.lean_training,
            )

    def ref_logprobs(
        self, agent_id: str, input_ids: torch.Tensor, attention_mask: torch.Tensor, action_mask: torch.Tensor
    ) -> torch.Tensor:
        """Log-probabilities (B, A) under the reference policy, without grad.

        The reference is the agent's ``ref_model`` when it names another model, else the frozen initial copy
        (``per_agent``, ``shared``), the base with adapters disabled (``lora``), or the agent's own model for
        frozen agents. An offloaded reference is on the device only during this call.

        Raises:
            FailedPreconditionError: ``keep_reference`` is off for a mode that needs a copy.
        """
        spec = self._check(agent_id)
        with torch.no_grad():
            if agent_id in self._refs:
                with self._reference_forward(self._refs[agent_id]) as ref:
                    return _sequence_logprobs(
                        ref, input_ids, attention_mask, action_mask, False, self._share_prefix
                    )
            if self.config.mode == "lora":
                model = self._activate(agent_id)
                with model.disable_adapter():
                    return _sequence_logprobs(
                        model, input_ids, attention_mask, action_mask, False, self._share_prefix
                    )
            if not spec.is_tuning:
                return _sequence_logprobs(
                    self._models[agent_id], input_ids, attention_mask, action_mask, False, self._share_prefix
                )
            raise FailedPreconditionError(
                f"agent {agent_id!r} has no reference policy (keep_reference=False)"
            )

    def state_for_sync(self, agent_id: str) -> dict[str, torch.Tensor]:
        """Weights a rollout engine needs for the agent: its adapter (``lora``: peft's
        ``get_peft_model_state_dict``, keys and values) or full state dict, detached (views of the live weights).

        In ``lora`` mode the adapter's parameters are matched to peft's keys at the first call and read directly
        afterwards (peft's function walks the whole model's state dict: 15 ms a call for SmolLM2, 2 vCPUs).
        """
        self._check(agent_id)
        model = self._models[agent_id]
        if self.config.mode != "lora":
            return {k: v.detach() for k, v in model.state_dict().items()}
        if agent_id not in self._sync_params:
            self._sync_params[agent_id] = _adapter_state_params(model, self._adapters[agent_id])
        named = self._sync_params[agent_id]
        if named is None:
            from peft import get_peft_model_state_dict

            state = get_peft_model_state_dict(model, adapter_name=self._adapters[agent_id])
            return {k: v.detach() for k, v in state.items()}
        return {k: p.detach() for k, p in named}

    def version(self, agent_id: str) -> int:
        """Current policy version of the agent (0 before any update)."""
        self._check(agent_id)
        return self._versions[agent_id]

    def bump_version(self, agent_id: str) -> int:
        """Increment and return the agent's version (every agent on the same weights moves with it)."""
        unit = self.unit_of(agent_id)
        new = self._versions[agent_id] + 1
        for a in self.agent_ids:
            if self.unit_of(a) == unit:
                self._versions[a] = new
        return new

    def train(self, mode: bool = True) -> None:
        """Set train/eval mode on every live model (references stay in eval)."""
        for m in {id(m): m for m in self._models.values()}.values():
            m.train(mode)

    # ------------------------------------------------------------------------------------------- persist
    def save(self, path: str | Path) -> None:
        """Write trainable weights and versions under ``path`` (safetensors + ``policy.json``).

        Layout: ``policy.json``; ``<unit>.safetensors`` per trainable unit (full weights) or
        ``adapter-<agent>.safetensors`` (``lora``, every agent's adapter).
        """
        from safetensors.torch import save_file

        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        meta = {
            "mode": self.config.mode,
            "agents": [asdict(a) for a in self.config.agents],
            "versions": self._versions,
        }
        if self.config.mode == "lora":
            from peft import get_peft_model_state_dict

            model = self._models[self.agent_ids[0]]
            for a in self.agent_ids:
                sd = get_peft_model_state_dict(model, adapter_name=self._adapters[a])
                save_file(
                    {k: v.detach().contiguous().cpu() for k, v in sd.items()},
                    root / f"adapter-{a}.safetensors",
                )
        else:
            for unit in sorted({self.unit_of(a) for a in self.trainable_agents}):
                agent = next(a for a in self.trainable_agents if self.unit_of(a) == unit)
                save_weights(self._models[agent], root / f"{unit}.safetensors")
        (root / "policy.json").write_text(json.dumps(meta, indent=2))

    def load(self, path: str | Path) -> None:
        """Restore what :meth:`save` wrote into this policy (same mode and agents).

        Raises:
            NotFoundError: ``path`` has no ``policy.json`` or a weights file is missing.
            FailedPreconditionError: The saved mode or agents differ from this policy's.
        """
        from safetensors.torch import load_file

        root = Path(path)
        meta_path = root / "policy.json"
        if not meta_path.is_file():
            raise NotFoundError(f"no policy checkpoint at {root} (missing policy.json)")
        meta = json.loads(meta_path.read_text())
        names = [a["name"] for a in meta["agents"]]
        if meta["mode"] != self.config.mode or names != self.agent_ids:
            raise FailedPreconditionError(
                f"checkpoint at {root} is mode {meta['mode']!r} with agents {names}; this policy is mode "
                f"{self.config.mode!r} with agents {self.agent_ids}"
            )
        if self.config.mode == "lora":
            from peft import set_peft_model_state_dict

            model = self._models[self.agent_ids[0]]
            for a in self.agent_ids:
                f = root / f"adapter-{a}.safetensors"
                if not f.is_file():
                    raise NotFoundError(f"adapter weights {f} missing")
                set_peft_model_state_dict(
                    model, load_file(str(f), device=str(self.device)), adapter_name=self._adapters[a]
                )
        else:
            for unit in sorted({self.unit_of(a) for a in self.trainable_agents}):
                agent = next(a for a in self.trainable_agents if self.unit_of(a) == unit)
                f = root / f"{unit}.safetensors"
                if not f.is_file():
                    raise NotFoundError(f"policy weights {f} missing")
                load_weights(self._models[agent], f, str(self.device))
        self._versions.update({k: int(v) for k, v in meta["versions"].items() if k in self._versions})


def _adapter_state_params(
    model: torch.nn.Module, adapter: str
) -> tuple[tuple[str, torch.nn.Parameter], ...] | None:
    """peft's state dict of ``adapter`` (``get_peft_model_state_dict``) as (key, parameter) pairs: each value matched
    to the parameter whose storage and shape it is; None when some value is not a parameter's (a buffer, a copy)."""
    from peft import get_peft_model_state_dict

    params = {(p.data_ptr(), tuple(p.shape)): p for p in model.parameters()}
    pairs = []
    for key, value in get_peft_model_state_dict(model, adapter_name=adapter).items():
        param = params.get((value.data_ptr(), tuple(value.shape)))
        if param is None or value.numel() == 0:
            return None
        pairs.append((key, param))
    return tuple(pairs)


def _adapter_of(param_name: str) -> str | None:
    """Adapter name inside a peft parameter name (``...lora_A.<adapter>.weight``), or None for base weights."""
    parts = param_name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part in ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_magnitude_vector"):
            return parts[i + 1]
    return None


def _sequence_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    action_mask: torch.Tensor,
    return_entropy: bool,
    share_prefix: bool = False,
    lean: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Shared forward of :meth:`MultiAgentPolicy.logprobs` (see there); computes logits for A positions only.

    With ``share_prefix``, rows that repeat a prompt run it once (:func:`~services.trainer.models.prefix_sharing.
    response_logits`); the result is the same up to float rounding. With ``lean``, a forward that
    :func:`~services.trainer.models.lean_training.applies` to runs :func:`~services.trainer.models.lean_training.
    response_logits` (the same function with fused products). Otherwise a CPU forward with grad (no gradient checkpointing) of at most
    :data:`~services.trainer.models.training_attention.MATH_ATTENTION_MAX_TOKENS` columns runs SDPA's math kernel
    (:func:`~services.trainer.models.training_attention.training_attention`); log-probabilities and entropies come
    from :func:`~services.trainer.models.token_logprobs.token_logprobs` (chunked, the entropy's backward only when
    the entropy is used).
    """
    if input_ids.dim() != 2 or tuple(attention_mask.shape) != tuple(input_ids.shape):
        raise InvalidArgumentError(
            f"input_ids (B, T) and attention_mask (B, T) must match, got {tuple(input_ids.shape)} and "
            f"{tuple(attention_mask.shape)}"
        )
    if action_mask.dim() != 2 or action_mask.shape[0] != input_ids.shape[0]:
        raise InvalidArgumentError(
            f"action_mask must be (B, A) with B={input_ids.shape[0]}, got {tuple(action_mask.shape)}"
        )
    num_tokens, num_actions = input_ids.shape[1], action_mask.shape[1]
    if not 1 <= num_actions < num_tokens:
        raise InvalidArgumentError(f"action_mask width A={num_actions} must be in [1, T={num_tokens})")
    device = next(model.parameters()).device
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    # (B, A, V): position T-A-1+j predicts token T-A+j
    if lean and lean_training.applies(model, num_tokens):
        logits = lean_training.response_logits(
            model, input_ids, attention_mask, num_actions, share=share_prefix
        )
    else:
        with training_attention(model, num_tokens):
            logits = response_logits(model, input_ids, attention_mask, num_actions, share=share_prefix)
    return token_logprobs(logits, input_ids[:, -num_actions:], entropy=return_entropy)
