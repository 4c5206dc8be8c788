"""What ``marti train`` checks before it prepares the run folder or starts a service, so that a bad config or
file fails at once, naming what is wrong, and never costs an ``--overwrite`` the run it would delete: a dataset
job's rows, labels, column names, prompt lengths, reward functions and reward model (:func:`check_dataset_job`),
the workflow section's import
paths (:func:`marti.team.workflow.check_workflow_section`), that ``rollout.engine: vllm`` can run here
(:func:`check_vllm_engine`), that the gateway's fixed ports are free (:func:`check_gateway_ports`) and, for a
job that starts its own env server, every env at
every curriculum level it can reach (:func:`check_envs_in_process`). :func:`check_before_the_run_folder` runs
them in that order. With a given (external) store, ``marti train`` also creates the job's tables there first
(:func:`check_given_store_tables`).
"""

from __future__ import annotations

import re
from typing import Any

import marti
from marti.config import TrainConfig
from marti.config.sections.dataset import DATASET_ENV
from marti.data import ProblemSet
from marti.errors import (
    DeadlineExceededError,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
    in_context,
)
from marti.rewards.functions import check_column_names
from marti.rpc.serving.bind import address_in_use_error, port_in_use
from marti.team.workflow import check_workflow_section
from services.trainer.data.tables import create_tables, table_settings
from services.trainer.data.tasks import DatasetTasks
from services.trainer.job.connections.addresses import Addresses, resolve_addresses
from services.trainer.job.run.env_sessions import check_env_sessions
from services.trainer.job.run.reply_lengths import check_reply_lengths
from services.trainer.models.resolve import TINY_ALIAS
from services.trainer.rollout.episodes.env_config import build_curriculum, check_envs
from services.trainer.rollout.episodes.scoring import build_scorer, check_reward_calls

__all__ = [
    "check_before_the_run_folder",
    "check_dataset_job",
    "check_envs_in_process",
    "check_gateway_ports",
    "check_given_store_tables",
    "check_vllm_engine",
    "job_config",
    "starts_own_env_server",
]


def check_before_the_run_folder(cfg: TrainConfig, *, env: str | None = None) -> DatasetTasks | None:
    """Every check ``marti train`` makes before the run folder: :func:`check_vllm_engine`,
    :func:`check_gateway_ports`, :func:`check_dataset_job`, every agent's reply length
    (:func:`~services.trainer.job.run.reply_lengths.check_reply_lengths`), the ``workflow``
    section (:func:`marti.team.workflow.check_workflow_section`, when the section is active) and, when the job starts
    its own env server (``env``, the ``--env`` flag, is None and the config has no ``services.env``),
    :func:`~services.trainer.job.run.env_sessions.check_env_sessions` (on :func:`job_config`) and
    :func:`check_envs_in_process`.

    Returns:
        The dataset job's problems (:class:`DatasetTasks`, for the job's loop), or None without a ``dataset``.

    Raises:
        InvalidArgumentError / NotFoundError / UnavailableError: what those checks raise (each names the key,
            file, row, task or level).
    """
    check_vllm_engine(cfg)
    check_gateway_ports(cfg)
    data = check_dataset_job(cfg)
    check_reply_lengths(cfg)
    if cfg.workflow.active:
        check_workflow_section(cfg.workflow, [a.name for a in cfg.agents])
    if starts_own_env_server(cfg, env):
        check_env_sessions(job_config(cfg, data))
        check_envs_in_process(cfg, data)
    return data


def check_gateway_ports(cfg: TrainConfig) -> None:
    """Refuse a job whose gateway (``gateway.enabled``) would listen on a fixed port (``gateway.http_port`` or
    ``gateway.grpc_port`` not 0) that another process holds, before any service starts: the gateway binds its
    ports once the job's actors are up, so the job would otherwise fail there, after ``--overwrite`` cleared the
    folder. A port taken between this check and the bind still fails there, with the same error.

    Raises:
        UnavailableError: "address in use", naming the endpoint, its key, the host and the port
            (:func:`marti.rpc.serving.bind.address_in_use_error`).
    """
    gateway = cfg.gateway
    if not gateway.enabled:
        return
    for endpoint, key, port in (
        ("HTTP", "http_port", gateway.http_port),
        ("gRPC", "grpc_port", gateway.grpc_port),
    ):
        if port_in_use(gateway.host, port):
            raise address_in_use_error(
                f"the gateway's {endpoint} endpoint (gateway.{key})", gateway.host, port
            )


def check_vllm_engine(
    cfg: TrainConfig, *, has_cuda: bool | None = None, vllm_installed: bool | None = None
) -> None:
    """Refuse ``rollout.engine: vllm`` on a machine where it cannot start, before any service does: the config's
    ``device`` (``auto`` or ``cuda``; ``cpu`` is refused by the config itself) has no CUDA device to resolve to,
    or the ``vllm`` package is not installed.

    Args:
        cfg: The job's config.
        has_cuda: Whether a CUDA device is visible; None asks torch.
        vllm_installed: Whether ``vllm`` is importable; None looks for it
            (:func:`services.trainer.rollout.vllm_available`).

    Raises:
        InvalidArgumentError: Naming ``rollout.engine`` and ``device`` (no CUDA) or the missing package.
    """
    if cfg.rollout.engine != "vllm":
        return
    if has_cuda is None:
        import torch

        has_cuda = bool(torch.cuda.is_available())
    if not has_cuda:
        resolves = " resolves to the CPU" if cfg.device == "auto" else " finds no CUDA device"
        raise InvalidArgumentError(
            f"rollout.engine=vllm needs a CUDA device, but device={cfg.device}{resolves} on this machine; "
            "set rollout.engine: auto (hf_static on the CPU), hf or hf_static"
        )
    if vllm_installed is None:
        from services.trainer.rollout import vllm_available

        vllm_installed = vllm_available()
    if not vllm_installed:
        raise InvalidArgumentError(
            "rollout.engine=vllm but the vllm package is not installed here (the gpu extra); install it, or set "
            "rollout.engine: auto or hf"
        )


def job_config(cfg: TrainConfig, data: DatasetTasks | None) -> TrainConfig:
    """``cfg`` as the job will run it: a dataset job's sized to its rows (``data``,
    :meth:`~services.trainer.data.tasks.DatasetTasks.sized`: its steps and held-out episodes), else ``cfg``."""
    return cfg if data is None else data.sized(cfg)


def starts_own_env_server(cfg: TrainConfig, env: str | None) -> bool:
    """Whether the job starts its own env server: no ``env`` address (the ``--env`` flag; nor
    ``MARTI_ENV_ADDR``) and no ``services.env``."""
    return "env" in resolve_addresses(cfg.services, env=env)[1]


def check_envs_in_process(cfg: TrainConfig, data: DatasetTasks | None) -> None:
    """Make each task's env at every curriculum level it can reach, in this process, before the run folder is
    prepared (so that a config the env refuses does not cost an ``--overwrite`` the run it would delete). Only
    for a job that starts its own env server (no ``--env`` and no ``services.env``), which runs the envs this
    process makes; an env this process does not know is left to the job's own check
    (:meth:`~services.trainer.job.run.loop.TrainingLoop.check_envs`).

    Raises:
        InvalidArgumentError: An env refused its config (the message names the task and the level).
    """
    from marti.env.registry import default_registry

    registry = default_registry()

    def make(name: str, seed: int, config: dict[str, Any]) -> Any:
        try:
            registry.resolve(name)
        except NotFoundError:
            return None
        return registry.make(name, config, seed)  # the config as a mapping, as the env server gets it

    check_envs(cfg, build_curriculum(cfg), data, make)


def check_dataset_job(cfg: TrainConfig) -> DatasetTasks | None:
    """What a dataset job can check before anything starts or any folder is touched: its rows (loaded and
    checked, with the held-out split; with the ``dataset_task`` env every row's label read by the job's verifier,
    as the env checks it), its columns (with reward functions, none named ``prompts`` or ``completions``:
    :func:`marti.rewards.functions.check_column_names`), every row's first prompt against the rollout engine's
    length (:func:`~services.trainer.job.run.prompt_lengths.check_prompt_lengths`), its reward functions and remote
    reward server (loaded, and each called once on the first two training rows:
    :func:`~services.trainer.rollout.episodes.scoring.check_reward_calls`) and its reward model's folder
    (``config.json`` a one-label sequence classifier, a tokenizer that loads, a weights file; the weights are read
    by the actor, and the ``tiny-llama`` alias is built there). ``marti train`` runs it
    before it prepares the run folder, so a bad file never costs the previous run of an ``--overwrite``, and
    hands the loaded problems to the job's loop (they are not loaded twice).

    Returns:
        The job's problems (:class:`DatasetTasks`), or None without a ``dataset`` section.

    Raises:
        InvalidArgumentError / NotFoundError / UnavailableError: what :class:`DatasetTasks`,
            :func:`services.trainer.rollout.episodes.scoring.build_scorer`,
            :func:`~services.trainer.rollout.episodes.scoring.check_reward_calls` and
            :func:`marti.rewards.model.check_reward_model` raise, naming the file, row, function or path.
    """
    if cfg.dataset is None:
        return None
    tasks = DatasetTasks(cfg)
    tasks.check_evaluation(cfg)
    if cfg.environment.env_name == DATASET_ENV:
        _check_labels(cfg, tasks)
    if cfg.reward.functions:
        for ps in _problem_sets(tasks):
            check_column_names(ps.columns, where=f"dataset {ps.source}")
    from services.trainer.job.run.prompt_lengths import check_prompt_lengths  # torch: after the cheap checks

    check_prompt_lengths(cfg, tasks)
    check_reward_calls(build_scorer(cfg, None), tasks)
    model = cfg.reward.model
    if model and model.strip().lower() != TINY_ALIAS:
        from marti.rewards.model import check_reward_model  # transformers: loaded when needed

        with in_context("reward.model (--reward_model)"):
            check_reward_model(model)
    return tasks


def _problem_sets(tasks: DatasetTasks) -> list[ProblemSet]:
    """The job's training rows and, when it has them, its held-out rows."""
    return [ps for ps in (tasks.problems.train, tasks.problems.eval) if ps is not None]


def _check_labels(cfg: TrainConfig, tasks: DatasetTasks) -> None:
    """Make the ``dataset_task`` env (in this process) once over all the training rows and once over the
    held-out rows with the job's env options: it refuses a row whose label the verifier cannot read. The
    refusal names the source and the row's position in it."""
    for ps in _problem_sets(tasks):
        conf = tasks.env_config(cfg, 0)
        conf.pop("row")
        conf["rows"] = [ps.row(i) for i in range(len(ps))]
        try:
            marti.make(DATASET_ENV, **conf).close()
        except InvalidArgumentError as exc:
            found = re.search(r"rows\[(\d+)\]", str(exc))
            where = f"{ps.where(int(found[1]))} of " if found else ""
            raise InvalidArgumentError(f"{where}dataset {ps.source}: {exc}") from None


def check_given_store_tables(cfg: TrainConfig, addresses: Addresses, *, timeout_s: float = 10.0) -> None:
    """Create the job's tables on a given (external) store, as the job would when it starts
    (:func:`~services.trainer.data.tables.create_tables`: idempotent for an identical config, nothing reset), so
    that a table left there with another config (an earlier job of this ``training_name`` with other staleness
    settings) is refused before the run folder, not after ``--overwrite`` cleared it. A store that does not
    answer within ``timeout_s`` seconds is not refused here: the job's connection retries decide.

    Raises:
        AlreadyExistsError: A table exists with another config (the differing fields and what to do named).
        UnauthenticatedError / PermissionDeniedError: The store refuses the job's token (none, or a wrong one).
        Every error's message starts with the store's address and its flag.
    """
    from marti import ExperienceSharingClient

    bounds, max_size = table_settings(cfg)
    store = ExperienceSharingClient(
        "trainer", addresses.store, token=addresses.token, tls_ca_file=addresses.ca_for("store"),
        timeout_s=timeout_s,
    )  # fmt: skip
    try:
        with in_context(f"store at {addresses.store} (--store or services.store)"):
            create_tables(store, cfg.training_name, bounds, max_size, lambda fn, what: fn())
    except (UnavailableError, DeadlineExceededError):
        return
    finally:
        store.close()
