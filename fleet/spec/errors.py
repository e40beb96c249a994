"""Errors of the fleet spec.

    SpecError            a stack file that cannot be used; holds every problem found, not just the first
      .problems          list[Problem]: file, key path, offending value, what is allowed

Warnings (a spec that works but wastes or risks something) are `Problem`s with ``level="warning"`` returned
by the loader next to the spec; they never raise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["Problem", "SpecError", "key_error", "key_warning"]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a stack file."""

    path: str  # full key path, e.g. "llmfleet:pools[0].engine.gpuMemoryUtilization"
    message: str  # what is wrong and what is allowed
    value: Any = None
    level: Literal["error", "warning"] = "error"
    file: str = ""

    def render(self) -> str:
        where = f"{self.file}: " if self.file else ""
        shown = "" if self.value is None else f" (got {_short(self.value)})"
        return f"{where}{self.path}: {self.message}{shown}"


class SpecError(ValueError):
    """A stack file failed validation; ``problems`` lists every error found in one pass."""

    def __init__(self, file: str, problems: list[Problem]) -> None:
        self.file = file
        self.problems = problems
        lines = "\n".join("  - " + p.render() for p in problems)
        super().__init__(f"{file}: {len(problems)} error(s) in the fleet spec:\n{lines}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def key_error(path: str, message: str, value: object = None) -> Problem:
    """An error at the stack key ``llmfleet:<path>``."""
    return Problem(f"llmfleet:{path}", message, value=value)


def key_warning(path: str, message: str) -> Problem:
    """A warning at the stack key ``llmfleet:<path>``."""
    return Problem(f"llmfleet:{path}", message, level="warning")
