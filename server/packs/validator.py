"""What the pack machinery asks of a family: its name and a check of a task's fields.

server/packs sits below the families (pyproject's import-linter contract "packs"): it takes
any object with these two members, and a family of palaestra.envs (envs/base.py's `Family`)
is one by its shape, with no import either way. The server hands its families in
(FamilyRegistry.all()); a tool with no families hands in their names only.
"""

from __future__ import annotations

from typing import Protocol

from palaestra.sdk.task import Task


class TaskValidator(Protocol):
    """A family as the pack loader sees it (`Family.name`, `Family.validate_task`)."""

    @property
    def name(self) -> str:
        """The family name tasks carry in `Task.family`."""
        ...

    def validate_task(self, task: Task) -> None:
        """Raise ValueError where the task's fields do not fit the family's models (a
        family's TaskFieldsError, whose `problem` names the field without the task)."""
        ...


def field_problem(exc: ValueError) -> str:
    """What `validate_task` found, as 'field: what is wrong' where the error says so."""
    problem = getattr(exc, "problem", None)
    return problem if isinstance(problem, str) else str(exc)
