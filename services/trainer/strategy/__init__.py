"""Training strategies behind one interface: plain torch and DeepSpeed ZeRO 0-3.

``DeepSpeedStrategy`` lives in :mod:`services.trainer.strategy.deepspeed_strategy` and imports DeepSpeed only
when used; :func:`make_strategy` builds either by name.
"""

from services.trainer.strategy.base import OptimConfig, StepResult, Strategy, TrainEngine, lr_multiplier
from services.trainer.strategy.torch_strategy import TorchStrategy, TorchTrainEngine


def make_strategy(name: str, **kwargs: object) -> Strategy:
    """Build a strategy by name: ``"torch"`` or ``"deepspeed"`` (kwargs go to the constructor).

    Raises:
        marti.errors.InvalidArgumentError: Unknown name.
    """
    from marti.errors import InvalidArgumentError

    if name == "torch":
        return TorchStrategy(**kwargs)  # type: ignore[arg-type]
    if name == "deepspeed":
        from services.trainer.strategy.deepspeed_strategy import DeepSpeedStrategy

        return DeepSpeedStrategy(**kwargs)  # type: ignore[arg-type]
    raise InvalidArgumentError(f"strategy must be 'torch' or 'deepspeed', got {name!r}")


__all__ = [
    "OptimConfig",
    "StepResult",
    "Strategy",
    "TorchStrategy",
    "TorchTrainEngine",
    "TrainEngine",
    "lr_multiplier",
    "make_strategy",
]
