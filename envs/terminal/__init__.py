"""The `terminal` family: multi-step shell work judged by hidden tests (docs/terminal.md)."""

from palaestra.envs.terminal.family import TerminalFamily

__all__ = ["TerminalFamily"]
