"""How many env sessions a training job can hold open at once, checked against its env server's cap before the
run folder (:func:`check_env_sessions` for the server the job starts, :func:`check_given_env_sessions` for one
given with ``--env`` or ``services.env``), so a job the server cannot hold fails at once, naming the keys, not at
its first rollout or evaluation with ``session cap reached`` after ``--overwrite`` cleared the run.

What is open at once (:func:`sessions_at_once`): a step's rollout opens its ``rollout.episodes_per_step``
sessions together and closes them when the last episode ends (none for ``rollout.source: external``); an
evaluation opens one per held-out episode (``eval_episodes`` x ``eval_samples``, for each task of a multi-task
job). With ``rollout.max_staleness`` >= 1 the next step's rollout plays in a thread while an evaluation between
steps runs, so both count together; otherwise they take turns.
"""

from __future__ import annotations

from marti.config import TrainConfig
from marti.errors import InvalidArgumentError
from services.trainer.job.connections.addresses import Addresses

__all__ = ["check_env_sessions", "check_given_env_sessions", "sessions_at_once"]


def _evaluation(cfg: TrainConfig) -> tuple[int, str]:
    """Sessions one evaluation opens and the keys that make them (0 and "" without evaluations)."""
    r = cfg.rollout
    if not r.eval_every:
        return 0, ""
    n = len(r.resolved_eval_seeds) * r.eval_samples * max(1, len(cfg.tasks))
    keys = f"rollout.eval_episodes {len(r.resolved_eval_seeds)}"
    keys += f" x rollout.eval_samples {r.eval_samples}" if r.eval_samples > 1 else ""
    keys += f" x {len(cfg.tasks)} tasks" if cfg.tasks else ""
    return n, keys


def sessions_at_once(cfg: TrainConfig) -> tuple[int, str]:
    """The most env sessions the job holds open at once, and what makes them up, naming the keys.

    Args:
        cfg: The job's config (a dataset job's sized to its rows:
            :meth:`~services.trainer.data.tasks.DatasetTasks.sized`, which caps ``eval_episodes`` at the
            held-out rows).

    Returns:
        ``(sessions, why)``, e.g. ``(24, "rollout.episodes_per_step 8 + rollout.eval_episodes 16: an evaluation
        runs while the next step's rollout plays (rollout.max_staleness 1)")``.
    """
    r = cfg.rollout
    train = 0 if r.source == "external" else r.episodes_per_step
    evals, eval_keys = _evaluation(cfg)
    steps = f"rollout.episodes_per_step {train}"
    if train and evals and r.max_staleness >= 1 and r.eval_every < cfg.total_steps:
        return train + evals, (
            f"{steps} + {eval_keys}: an evaluation runs while the next step's rollout plays "
            f"(rollout.max_staleness {r.max_staleness})"
        )
    if evals > train:
        return evals, f"{eval_keys}, one evaluation's episodes"
    return train, f"{steps}, one step's episodes"


def check_env_sessions(cfg: TrainConfig, cap: int | None = None, server: str | None = None) -> None:
    """Refuse a job that holds more env sessions at once (:func:`sessions_at_once`) than its env server takes.

    Args:
        cfg: The job's config (a dataset job's sized to its rows).
        cap: The server's ``max_sessions``; None: the job's own env server's
            (:class:`services.env_server.settings.EnvServerSettings`, read as that server reads it:
            ``MARTI_ENV_MAX_SESSIONS`` or the default 1024).
        server: The server, as the message names it; None: the job's own.

    Raises:
        InvalidArgumentError: Naming the sessions, the keys that make them, the cap and the ways out; or a bad
            ``MARTI_ENV_*`` variable of the job's own server, naming it and its value.
    """
    if cap is None:
        cap = _own_server_cap()
        server = "the job's own env server (max_sessions, MARTI_ENV_MAX_SESSIONS)"
    n, why = sessions_at_once(cfg)
    if n > cap:
        raise InvalidArgumentError(
            f"the job holds up to {n} env sessions open at once ({why}; one session per episode), but "
            f"{server} holds at most {cap}; lower those keys, or give an env server with a larger max_sessions "
            "(--env)"
        )


def _own_server_cap() -> int:
    """The job's own env server's ``max_sessions``, read as that server reads its settings.

    Raises:
        InvalidArgumentError: A bad ``MARTI_ENV_*`` variable, in one line naming it and its value
            (:func:`marti.rpc.settings.settings_error_line`), as the server would refuse it.
    """
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    from marti.rpc.settings import settings_error_line
    from services.env_server.settings import EnvServerSettings

    try:
        return EnvServerSettings().max_sessions
    except (ValidationError, SettingsError) as exc:
        line = settings_error_line(EnvServerSettings, {}, exc)
        raise InvalidArgumentError(f"the job's own env server: {line}") from None


def check_given_env_sessions(cfg: TrainConfig, addresses: Addresses, *, timeout_s: float = 10.0) -> None:
    """:func:`check_env_sessions` against a given env server's cap, read from it (``ListEnvs``' ``max_sessions``).

    Left to the job: a pool of env servers (its sessions go to the server with the fewest of the job's, so no
    one cap bounds the job), and a server too old to say its cap. Sessions other jobs hold there are not
    counted: they come and go.

    Raises:
        InvalidArgumentError: As :func:`check_env_sessions`, naming the address.
        MartiError: The server's answer to ``ListEnvs`` failed.
    """
    from marti.clients.env import EnvClient
    from marti.clients.env.addresses import is_env_pool

    if is_env_pool(addresses.env):
        return
    address = addresses.env if isinstance(addresses.env, str) else addresses.env[0]
    ca = addresses.ca_for("env")
    with EnvClient(address, token=addresses.token, tls_ca_file=ca, timeout_s=timeout_s) as client:
        cap = client.server_info().max_sessions
    if cap:
        where = f"the env server at {address} (--env or services.env; its max_sessions)"
        check_env_sessions(cfg, cap, where)
