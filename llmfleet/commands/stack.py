"""Stack: the one way a command loads its stack, printing every problem when the stack does not load."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fleet.spec.errors import SpecError
from fleet.spec.loader import LoadedStack, load_spec
from fleet.spec.plugins import Registry

__all__ = ["load_or_report"]


def load_or_report(stack: str | Path, registries: Sequence[Registry[Any]] = ()) -> LoadedStack | None:
    """The loaded stack; None after printing the `SpecError` (every problem, with its key path) on stderr.

    The caller returns its own exit status for a stack that does not load (``llmfleet plan`` 1, the rest 2).
    """
    try:
        return load_spec(stack, registries=registries)
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return None
