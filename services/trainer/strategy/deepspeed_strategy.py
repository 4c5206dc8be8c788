"""DeepSpeed ZeRO (stages 0-3) training strategy, on CUDA (nccl) or CPU (gloo).

On a machine without CUDA, ``DS_ACCELERATOR=cpu`` is set before DeepSpeed is imported, and the process group
uses gloo. The optimizer is always a plain ``torch.optim.AdamW`` handed to ``deepspeed.initialize`` (a "client
optimizer"), which avoids DeepSpeed's JIT-built optimizer kernels (about 60 s each on first use); DeepSpeed's
first use still JIT-builds one communication op (about 35 s, cached in ``~/.cache/torch_extensions``).

Single process: when no process group exists, one of world size 1 is created on 127.0.0.1 with a free port
(``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` from the environment win, so torchrun and Ray set-ups
work unchanged).

DeepSpeed owns accumulation (``gradient_accumulation_steps``), clipping (``gradient_clipping``), the LR scheduler
step at each boundary, and bf16 (``bf16.enabled``: bf16 weights with fp32 master copies in the optimizer).
Checkpoints use ``engine.save_checkpoint`` (model, optimizer, scheduler) plus our RNG file and ``state.json``.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from marti.errors import FailedPreconditionError, InvalidArgumentError, NotFoundError
from services.trainer.job.run.checkpoint import load_rng_state, save_rng_state, write_json_atomic
from services.trainer.strategy.base import (
    OptimConfig,
    StepResult,
    Strategy,
    TrainEngine,
    apply_configured_hyperparams,
    make_optimizer,
    make_scheduler,
    resolve_bf16,
)

_TAG = "ckpt"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def import_deepspeed() -> Any:
    """Import DeepSpeed, selecting the CPU accelerator when CUDA is absent.

    Raises:
        FailedPreconditionError: DeepSpeed is not installed.
    """
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        import deepspeed
    except ImportError as exc:
        raise FailedPreconditionError(f"DeepSpeedStrategy needs the 'deepspeed' package: {exc}") from None
    return deepspeed


#: Ports :func:`ensure_process_group` tries when it picks ``MASTER_PORT`` itself.
PORT_ATTEMPTS = 3


def skip_shm_comm_build(deepspeed: Any) -> None:
    """Keep DeepSpeed from building its CPU shared-memory all-reduce kernel in this process.

    On a machine without CUDA, ``deepspeed.init_distributed`` JIT-compiles ``deepspeed_shm_comm`` (C++, about 75 s
    of two g++ processes on 2 cores, again for every new install path) whenever its op probe says it can be built.
    One process has nothing to all-reduce with, so :func:`ensure_process_group` marks the op as not buildable (in
    DeepSpeed's cached ``deepspeed.ops.__compatible_ops__``, the dict ``build_shm_op`` consults) when the world
    size is 1; DeepSpeed then uses plain gloo collectives, as on platforms without the kernel.
    """
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def ensure_process_group(backend: str | None = None) -> None:
    """Create a world-size-1 process group unless one exists (env vars override rank, size, address, port).

    With one process on a machine without CUDA, DeepSpeed's shared-memory all-reduce kernel is not built
    (:func:`skip_shm_comm_build`).

    When ``MASTER_PORT`` is not set, a free port is picked; another process can take it between the pick and
    the rendezvous store's bind (``EADDRINUSE``), so up to :data:`PORT_ATTEMPTS` freshly picked ports are tried.

    Raises:
        torch.distributed.DistNetworkError: The rendezvous failed (a ``MASTER_PORT`` the caller set is in use, or
            every picked port was taken).
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return
    deepspeed = import_deepspeed()
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    picked = "MASTER_PORT" not in os.environ
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if os.environ["WORLD_SIZE"] == "1" and not torch.cuda.is_available():
        skip_shm_comm_build(deepspeed)
    for attempt in range(1, PORT_ATTEMPTS + 1):
        if picked:
            os.environ["MASTER_PORT"] = str(_free_port())
        try:
            deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False)
            return
        except dist.DistNetworkError as exc:
            if not picked or attempt == PORT_ATTEMPTS or "EADDRINUSE" not in str(exc):
                raise


class DeepSpeedTrainEngine(TrainEngine):
    """A :class:`TrainEngine` on a DeepSpeed engine (see :class:`DeepSpeedStrategy`)."""

    def __init__(self, ds_engine: Any, cfg: OptimConfig, bf16: bool, zero_stage: int) -> None:
        self.ds = ds_engine
        self.model = ds_engine.module
        self.cfg = cfg
        self.bf16 = bf16
        self.zero_stage = zero_stage
        self.global_step = 0
        self.micro_step = 0

    @property
    def lr(self) -> float:
        """Learning rate the next optimizer step uses."""
        return float(self.ds.get_lr()[0])

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """No-op: with ``bf16.enabled`` DeepSpeed already holds bf16 weights, else fp32."""
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        """``ds_engine.backward`` (it divides by ``gradient_accumulation_steps`` itself).

        Raises:
            InvalidArgumentError: ``loss`` is not a scalar tensor.
        """
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise InvalidArgumentError(
                f"loss must be a scalar tensor, got {getattr(loss, 'shape', type(loss))}"
            )
        self.ds.backward(loss)

    def step(self) -> StepResult:
        """``ds_engine.step``: at a boundary it clips, steps optimizer and scheduler, and zeroes gradients."""
        boundary = self.ds.is_gradient_accumulation_boundary()
        lr = self.lr
        pre_norm = None
        if boundary and self.zero_stage == 0:  # stage 0 keeps plain .grad and reports no norm itself
            grads = [p.grad for p in self.model.parameters() if p.grad is not None]
            pre_norm = (
                float(
                    torch.linalg.vector_norm(
                        torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])
                    )
                )
                if grads
                else 0.0
            )
        self.ds.step()
        self.micro_step += 1
        if not boundary:
            return StepResult(stepped=False, grad_norm=None, lr=lr)
        norm = self.ds.get_global_grad_norm() if pre_norm is None else pre_norm
        norm_f = float(norm) if norm is not None else None
        skipped = bool(getattr(self.ds, "skipped_steps", 0) > getattr(self, "_skipped_seen", 0))
        self._skipped_seen = getattr(self.ds, "skipped_steps", 0)
        if not skipped:
            self.global_step += 1
            self.run_step_hooks()
        return StepResult(stepped=not skipped, grad_norm=norm_f, lr=lr, skipped_nonfinite=skipped)

    @contextlib.contextmanager
    def gathered(self, modify: bool = False) -> Iterator[None]:
        """Gather ZeRO-3 partitions so every parameter is whole inside the block (no-op for stages 0-2); with
        ``modify`` the block's writes are scattered back to the partitions on exit (rank 0's values)."""
        if self.zero_stage == 3:
            deepspeed = import_deepspeed()
            rank = 0 if modify else None
            with deepspeed.zero.GatheredParameters(list(self.model.parameters()), modifier_rank=rank):
                yield
        else:
            yield

    def save_checkpoint(self, path: str | Path, data_position: Mapping[str, Any] | None = None) -> None:
        """Model, optimizer and scheduler through DeepSpeed; RNG and ``state.json`` (counters, data position)."""
        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        self.ds.save_checkpoint(str(root), tag=_TAG)
        save_rng_state(root / "rng.pt")
        write_json_atomic(
            root / "state.json",
            {
                "global_step": self.global_step,
                "micro_step": self.micro_step,
                "data_position": dict(data_position or {}),
            },
        )

    def load_checkpoint(self, path: str | Path, *, restore_rng: bool = True) -> dict[str, Any]:
        """Restore what :meth:`save_checkpoint` wrote.

        Raises:
            NotFoundError: The folder lacks the DeepSpeed tag folder or ``state.json``.
        """
        root = Path(path)
        if not (root / _TAG).is_dir() or not (root / "state.json").is_file():
            raise NotFoundError(f"no DeepSpeed checkpoint at {root} (needs {_TAG}/ and state.json)")
        load_path, _ = self.ds.load_checkpoint(
            str(root), tag=_TAG, load_optimizer_states=True, load_lr_scheduler_states=True
        )
        if load_path is None:
            raise NotFoundError(f"DeepSpeed could not load the checkpoint at {root}")
        scheduler = self.ds.lr_scheduler  # our LambdaLR over the client AdamW the ZeRO optimizer steps
        if scheduler is not None:  # a resume may change the learning rate, betas, eps or weight decay
            apply_configured_hyperparams(scheduler.optimizer, scheduler, self.cfg)
        state = json.loads((root / "state.json").read_text())
        self.global_step, self.micro_step = int(state["global_step"]), int(state["micro_step"])
        if restore_rng:
            load_rng_state(root / "rng.pt")
        return dict(state["data_position"])


DEEPSPEED_BUCKET_ELEMENTS = 500_000_000
"""DeepSpeed's default ``reduce_bucket_size`` and ``allgather_bucket_size`` (elements)."""


BUCKET_ALIGNMENT = 64
"""Bucket sizes are multiples of this many elements (DeepSpeed asserts the all-gather bucket is a multiple of its
``nccl_start_alignment_factor``, 2 today)."""


def bucket_elements(num_params: int) -> int:
    """ZeRO's reduce / all-gather bucket size for a model of ``num_params`` trained elements: DeepSpeed's default
    (:data:`DEEPSPEED_BUCKET_ELEMENTS`), or the model's size when smaller (a bucket never needs more), rounded up to
    a multiple of :data:`BUCKET_ALIGNMENT` (at least one such multiple)."""
    size = max(1, min(DEEPSPEED_BUCKET_ELEMENTS, int(num_params)))
    return -(-size // BUCKET_ALIGNMENT) * BUCKET_ALIGNMENT


class DeepSpeedStrategy(Strategy):
    """DeepSpeed ZeRO with a torch AdamW client optimizer.

    Args:
        zero_stage: 0, 1, 2 or 3.
        offload_optimizer: ZeRO-Offload of optimizer states to CPU (stages 1-3; needs CUDA).
        dist_backend: Process-group backend when one must be created (default nccl on CUDA, gloo on CPU).
        micro_batch_size: Recorded as ``train_micro_batch_size_per_gpu`` (DeepSpeed uses it only for logging
            and throughput counters, since batches are fed by the caller).

    Raises:
        InvalidArgumentError: ``zero_stage`` outside 0-3, or offload without CUDA.
    """

    def __init__(
        self,
        zero_stage: int = 2,
        *,
        offload_optimizer: bool = False,
        dist_backend: str | None = None,
        micro_batch_size: int = 1,
    ) -> None:
        if zero_stage not in (0, 1, 2, 3):
            raise InvalidArgumentError(f"zero_stage must be 0, 1, 2 or 3, got {zero_stage!r}")
        if offload_optimizer and (zero_stage == 0 or not torch.cuda.is_available()):
            raise InvalidArgumentError("offload_optimizer needs ZeRO stage 1-3 and CUDA")
        if micro_batch_size < 1:
            raise InvalidArgumentError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        self.zero_stage = zero_stage
        self.offload_optimizer = offload_optimizer
        self.dist_backend = dist_backend
        self.micro_batch_size = micro_batch_size

    def ds_config(self, cfg: OptimConfig, bf16: bool, num_params: int | None = None) -> dict[str, Any]:
        """The DeepSpeed config dict built from ``cfg`` (exposed for inspection and tests).

        With ``num_params`` (the trained parameters' element count) and ZeRO stage 1-3, the gradient reduce and
        all-gather buckets hold at most that many elements (:func:`bucket_elements`): DeepSpeed's default of
        :data:`DEEPSPEED_BUCKET_ELEMENTS` makes its engine allocate buffers of that many values whatever the model
        (2 GB of float32 per buffer, several GB per engine, never touched for a small model but never returned
        either: a process that built a few engines held tens of GB of address space, and a fork from it failed
        with ENOMEM). Bucket boundaries only group the same element-wise reductions, so results are unchanged.
        """
        zero: dict[str, Any] = {"stage": self.zero_stage}
        if self.offload_optimizer:
            zero["offload_optimizer"] = {"device": "cpu"}
        if num_params is not None and self.zero_stage > 0:
            zero["reduce_bucket_size"] = zero["allgather_bucket_size"] = bucket_elements(num_params)
        return {
            "train_micro_batch_size_per_gpu": self.micro_batch_size,
            "gradient_accumulation_steps": cfg.grad_accum_steps,
            "gradient_clipping": cfg.max_grad_norm or 0.0,
            "zero_optimization": zero,
            "bf16": {"enabled": bf16},
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 2**31 - 1,
            "wall_clock_breakdown": False,
        }

    def setup(
        self, model: torch.nn.Module, params: Iterable[torch.nn.Parameter], cfg: OptimConfig
    ) -> DeepSpeedTrainEngine:
        """``deepspeed.initialize`` with a torch AdamW over ``params`` and the cosine LambdaLR."""
        deepspeed = import_deepspeed()
        ensure_process_group(self.dist_backend)
        plist = list(params)
        device = plist[0].device if plist else torch.device("cpu")
        bf16 = resolve_bf16(cfg.bf16, device)
        optimizer = make_optimizer(plist, cfg)
        scheduler = make_scheduler(optimizer, cfg)
        # With bf16 at ZeRO stage 0, DeepSpeed wraps the optimizer in FP16_UnfusedOptimizer, which steps it once
        # with zero gradients inside initialize to create its state: that step would apply weight decay and
        # leave Adam's step count at 1 (a first real update ~0.73x the size, bias corrections one step ahead).
        # It runs at lr 0 here, and the state it made is dropped, so the first real update is Adam's first.
        lrs = [group["lr"] for group in optimizer.param_groups]
        for group in optimizer.param_groups:
            group["lr"] = 0.0
        engine, _, _, _ = deepspeed.initialize(
            model=model,
            optimizer=optimizer,
            lr_scheduler=scheduler,
            config=self.ds_config(cfg, bf16, sum(getattr(p, "ds_numel", p.numel()) for p in plist)),
        )
        for group, lr in zip(optimizer.param_groups, lrs, strict=True):
            group["lr"] = lr
        optimizer.state.clear()
        return DeepSpeedTrainEngine(engine, cfg, bf16, self.zero_stage)
