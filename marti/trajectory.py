"""Trajectory domain types shared by agents, the experience store and the trainer.

``from marti.trajectory import Trajectory, Turn`` -- see
:mod:`services.experience_store.core.trajectory` for field shapes (T_prompt prompt tokens, A response tokens).
"""

from services.experience_store.core.trajectory import AgentTurn, Trajectory, Turn, merge_by_step

__all__ = ["AgentTurn", "Trajectory", "Turn", "merge_by_step"]
