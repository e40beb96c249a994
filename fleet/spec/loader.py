"""Loader: read a stack file, turn its ``llmfleet:*`` keys into a FleetSpec, report every problem at once.

The caller passes the plugin registries of what it runs (``registries``): plugin names and parameters are
checked against exactly those, and the loader imports no component itself.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from fleet.spec.errors import Problem, SpecError
from fleet.spec.plugins import Registry
from fleet.spec.problems import NAMESPACE, validation_problems
from fleet.spec.stack import FleetSpec
from fleet.spec.validate import check_spec

__all__ = [
    "LoadedStack",
    "NAMESPACE",
    "STACKS_DIR",
    "control_plane_url",
    "find_stack",
    "list_stacks",
    "load_or_report",
    "load_spec",
    "parse_spec",
]

STACKS_DIR = Path(__file__).resolve().parents[2] / "stacks"


@dataclass(frozen=True)
class LoadedStack:
    """A validated spec plus the warnings found while checking it."""

    name: str
    file: str
    spec: FleetSpec
    warnings: list[Problem]


def list_stacks(stacks_dir: Path = STACKS_DIR) -> list[str]:
    return sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in stacks_dir.glob("Pulumi.*.yaml"))


def find_stack(name: str, stacks_dir: Path = STACKS_DIR) -> Path:
    path = stacks_dir / f"Pulumi.{name}.yaml"
    if not path.is_file():
        known = ", ".join(list_stacks(stacks_dir)) or "none"
        raise SpecError(str(path), [Problem("stack", f"no stack {name!r}; stacks: {known}", file=str(path))])
    return path


def load_spec(
    stack_or_file: str | Path, stacks_dir: Path = STACKS_DIR, registries: Sequence[Registry[Any]] = ()
) -> LoadedStack:
    """Load a stack by name (``prod``) or by path; raise SpecError listing every problem."""
    path = Path(stack_or_file)
    if not (path.suffix in (".yaml", ".yml") and path.exists()):
        path = find_stack(str(stack_or_file), stacks_dir)
    path = _display_path(path)
    name = path.name.removeprefix("Pulumi.").removesuffix(".yaml").removesuffix(".yml")
    try:
        document = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise SpecError(str(path), [Problem("(yaml)", f"not valid YAML: {exc}", file=str(path))]) from exc
    return parse_spec(document, file=str(path), name=name, registries=registries)


def load_or_report(stack_or_file: str | Path, registries: Sequence[Registry[Any]] = ()) -> LoadedStack | None:
    """`load_spec`, for a command: None after printing the `SpecError` (every problem, with its key path) on stderr.

    The caller returns its own exit status for a stack that does not load (``llmfleet plan`` 1, the rest 2).
    """
    try:
        return load_spec(stack_or_file, registries=registries)
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return None


def control_plane_url(stack: str, override: str | None) -> str:
    """Where an operator's command reaches the control plane: ``override``, else the stack's
    (`ControlPlaneSpec.client_url`); SpecError when the stack has to be read and cannot be."""
    return override if override is not None else load_spec(stack).spec.control_plane.client_url


def _display_path(path: Path) -> Path:
    """The path relative to the working directory when it is below it (shorter error messages)."""
    try:
        return path.resolve().relative_to(Path.cwd())
    except ValueError:
        return path


def config_values(document: Any, file: str) -> dict[str, Any]:
    """The ``llmfleet:`` keys of a stack document's ``config:`` block, without the namespace."""
    if not isinstance(document, Mapping) or not isinstance(document.get("config"), Mapping):
        raise SpecError(file, [Problem("config", "a stack file needs a top-level 'config:' mapping", file=file)])
    values: dict[str, Any] = {}
    for key, value in document["config"].items():
        namespace, _, short = str(key).partition(":")
        if namespace == NAMESPACE:
            values[short] = value
        elif str(key) == "aws:region":
            values.setdefault("region", value)
    return values


def parse_spec(
    document: Any, file: str = "<memory>", name: str = "", registries: Sequence[Registry[Any]] = ()
) -> LoadedStack:
    """Validate a parsed stack document (the YAML's top-level mapping) against the spec and ``registries``."""
    values = config_values(document, file)
    try:
        spec = FleetSpec.model_validate(values)
    except ValidationError as exc:
        raise SpecError(file, validation_problems(exc, FleetSpec, file=file)) from None
    problems = [dataclasses.replace(p, file=file) for p in check_spec(spec, registries)]
    errors = [p for p in problems if p.level == "error"]
    if errors:
        raise SpecError(file, errors)
    return LoadedStack(name=name, file=file, spec=spec, warnings=[p for p in problems if p.level == "warning"])
