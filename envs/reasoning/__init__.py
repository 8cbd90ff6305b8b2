"""The `reasoning` family: reasoning-gym's procedural datasets, scored by their own scorers."""

from palaestra.envs.reasoning.family import ReasoningFamily

__all__ = ["ReasoningFamily"]
