"""The `coding` family: function-level Python tasks verified by hidden tests."""

from palaestra.envs.coding.family import CodingFamily

__all__ = ["CodingFamily"]
