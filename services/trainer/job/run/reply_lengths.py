"""Every agent's reply length against the rollout engine's, checked before the run folder in any job
(:func:`check_reply_lengths`): a ``max_new_tokens`` that leaves no room for a prompt failed at the first episode,
after ``--overwrite`` had cleared the run. It reads the models' configs alone and imports torch only where the
engine could be vLLM (``rollout.engine: auto`` with vLLM installed and a device that may be CUDA), so a job
refused by this or a later check before the run folder is refused in well under a second.

:func:`reply_limit` and :func:`reply_length` are also what a dataset job's prompt check
(:mod:`services.trainer.job.run.prompt_lengths`) measures each row against.
"""

from __future__ import annotations

from marti.config import TrainConfig
from marti.errors import InvalidArgumentError
from services.trainer.models.model_config import model_max_positions

__all__ = ["check_reply_lengths", "reply_length", "reply_limit"]


def check_reply_lengths(cfg: TrainConfig) -> None:
    """Check, in any job, that every agent's ``max_new_tokens`` leaves room for a prompt in the rollout engine's
    length: a reply as long as the model's context fails at the first episode, whatever the prompt. A scripted
    agent (``workflow.roles[].scripted``) replies from Python and generates nothing: it is not checked.

    Raises:
        InvalidArgumentError: The first agent whose reply does not fit, naming it, the config key and its value,
            the limit and what sets it.
        NotFoundError: A model cannot be found locally.
    """
    scripted = {r.agent for r in cfg.workflow.roles if r.scripted} if cfg.workflow.active else set()
    for index, agent in enumerate(cfg.agents):
        if agent.name in scripted:
            continue
        limit, limit_from = reply_limit(cfg, index)
        reply, key = reply_length(cfg, index)
        if reply >= limit:
            raise InvalidArgumentError(
                f"agent {agent.name!r} (agents[{index}]): {key} {reply} leaves no room for a prompt in the {limit} "
                f"tokens the rollout engine takes ({limit_from}); lower {key}"
            )


def reply_limit(cfg: TrainConfig, index: int) -> tuple[int, str]:
    """The most prompt-plus-reply tokens the job's rollout engine takes for agent ``index``'s model, and what sets
    it: the vLLM engine's ``max_model_len``, else the model's ``max_position_embeddings``.

    Raises:
        NotFoundError: The model cannot be found locally.
    """
    if _uses_vllm(cfg):
        from services.trainer.rollout.engines.vllm_engine import VLLM_MAX_MODEL_LEN

        return VLLM_MAX_MODEL_LEN, "the vLLM engine's max_model_len"
    model = cfg.agents[index].pretrain_model
    n = model_max_positions(model)
    return n, f"max_position_embeddings of agents[{index}].pretrain_model {model!r}"


def reply_length(cfg: TrainConfig, index: int) -> tuple[int, str]:
    """Agent ``index``'s ``max_new_tokens`` and the config key that sets it (its own ``sampling``, else
    ``rollout.max_new_tokens``)."""
    agent = cfg.agents[index]
    own = agent.sampling.max_new_tokens is not None
    key = f"agents[{index}].sampling.max_new_tokens" if own else "rollout.max_new_tokens"
    return cfg.sampling_for(agent.name).max_new_tokens, key


def _uses_vllm(cfg: TrainConfig) -> bool:
    """Whether the job's rollout engine is vLLM: ``rollout.engine``, with ``auto`` resolved as the job resolves it
    (:func:`~services.trainer.rollout.engines.generation.resolve_auto_engine` on the job's device), which can be
    vLLM only where vLLM is installed and the device is not ``cpu``: only then is torch imported to ask."""
    engine = cfg.rollout.engine
    if engine != "auto":
        return engine == "vllm"
    from services.trainer.rollout import vllm_available

    if cfg.device == "cpu" or not vllm_available():
        return False
    from services.trainer.ray.actor_setup import resolve_device
    from services.trainer.rollout.engines.generation import resolve_auto_engine

    return resolve_auto_engine(resolve_device(cfg)) == "vllm"
