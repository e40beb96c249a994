"""Loader: read a stack file, turn its ``llmfleet:*`` keys into a FleetSpec, report every problem at once."""

from __future__ import annotations

import difflib
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from fleet.errors import Problem, SpecError
from fleet.spec import FleetSpec

__all__ = ["LoadedStack", "NAMESPACE", "STACKS_DIR", "find_stack", "list_stacks", "load_spec", "parse_spec"]

NAMESPACE = "llmfleet"
STACKS_DIR = Path(__file__).resolve().parent.parent / "stacks"


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


def load_spec(stack_or_file: str | Path, stacks_dir: Path = STACKS_DIR) -> LoadedStack:
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
    return parse_spec(document, file=str(path), name=name)


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


def parse_spec(document: Any, file: str = "<memory>", name: str = "") -> LoadedStack:
    """Validate a parsed stack document (the YAML's top-level mapping)."""
    from fleet.validate import check_spec  # cross-field checks need the catalogue and registries

    values = config_values(document, file)
    try:
        spec = FleetSpec.model_validate(values)
    except ValidationError as exc:
        raise SpecError(file, [_problem(err, file) for err in exc.errors()]) from None
    problems = [p.__class__(**{**p.__dict__, "file": file}) for p in check_spec(spec)]
    errors = [p for p in problems if p.level == "error"]
    if errors:
        raise SpecError(file, errors)
    return LoadedStack(name=name, file=file, spec=spec, warnings=[p for p in problems if p.level == "warning"])


def format_path(loc: tuple[int | str, ...]) -> str:
    """("pools", 0, "engine", "x") -> "llmfleet:pools[0].engine.x"."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + part
    return f"{NAMESPACE}:{out}"


def _problem(err: Mapping[str, Any], file: str) -> Problem:
    loc = tuple(part for part in err["loc"] if not _is_union_tag(part))
    kind = err["type"]
    if kind == "extra_forbidden":
        allowed = _allowed_keys(loc[:-1])
        key = str(loc[-1])
        close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        message = f"unknown key; {hint}allowed keys: {', '.join(allowed)}"
        return Problem(format_path(loc), message, file=file)
    message = str(err["msg"]).removeprefix("Value error, ")
    if kind == "literal_error":
        message = f"not allowed; {message}"
    value = err.get("input") if kind != "missing" else None
    if isinstance(value, Mapping):
        value = None
    return Problem(format_path(loc), message, value=value, file=file)


def _is_union_tag(part: int | str) -> bool:
    # pydantic adds the member type to locations inside unions (e.g. "float", "function-after[...]").
    return isinstance(part, str) and (part in {"float", "int", "str", "none"} or "[" in part)


def _allowed_keys(loc: tuple[int | str, ...]) -> list[str]:
    model: type[BaseModel] | None = FleetSpec
    for part in loc:
        if model is None:
            return []
        if isinstance(part, int):
            continue
        field = _field_by_alias(model, part)
        model = _model_of(field.annotation) if field is not None else None
    if model is None:
        return []
    return sorted(f.alias or n for n, f in model.model_fields.items())


def _field_by_alias(model: type[BaseModel], key: str) -> Any:
    for name, field in model.model_fields.items():
        if key in (name, field.alias):
            return field
    return None


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None
