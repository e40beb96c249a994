"""Problems: pydantic validation errors as `Problem`s with full key paths, allowed keys and did-you-mean.

Used for the stack file as a whole (root model `FleetSpec`) and for each plugin's parameter block (root model
the plugin's `Params`, under a prefix such as ``gateway.routing.picker.params``), so both read the same way:

    llmfleet:gateway.routing.picker.params.loadFactr: unknown key; did you mean 'loadFactor'? allowed keys: ...
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from fleet.spec.errors import Problem

__all__ = ["NAMESPACE", "format_path", "validation_problems"]

NAMESPACE = "llmfleet"


def format_path(loc: Sequence[int | str]) -> str:
    """("pools", 0, "engine", "x") -> "llmfleet:pools[0].engine.x"."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + part
    return f"{NAMESPACE}:{out}"


def validation_problems(
    exc: ValidationError, root: type[BaseModel], prefix: Sequence[int | str] = (), file: str = ""
) -> list[Problem]:
    """One `Problem` per error of ``exc``, raised while validating ``root`` found at key path ``prefix``."""
    return [_problem(err, root, tuple(prefix), file) for err in exc.errors()]


def _problem(err: Mapping[str, Any], root: type[BaseModel], prefix: tuple[int | str, ...], file: str) -> Problem:
    loc = tuple(part for part in err["loc"] if not _is_union_tag(part))
    kind = err["type"]
    if kind == "extra_forbidden":
        allowed = _allowed_keys(root, loc[:-1])
        key = str(loc[-1])
        renamed = _renamed(root, loc[:-1], key)
        if renamed is not None:
            message = f"keys are camelCase: use {renamed!r}; allowed keys: {', '.join(allowed)}"
        else:
            close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}? " if close else ""
            message = f"unknown key; {hint}allowed keys: {', '.join(allowed) or 'none'}"
        return Problem(format_path(prefix + loc), message, file=file)
    message = str(err["msg"]).removeprefix("Value error, ")
    if kind == "literal_error":
        message = f"not allowed; {message}"
    value = err.get("input") if kind != "missing" else None
    if isinstance(value, Mapping):
        value = None
    return Problem(format_path(prefix + loc), message, value=value, file=file)


def _is_union_tag(part: int | str) -> bool:
    # pydantic adds the member type to locations inside unions (e.g. "float", "function-after[...]").
    return isinstance(part, str) and (part in {"float", "int", "str", "none"} or "[" in part)


def _model_at(root: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    model: type[BaseModel] | None = root
    keyed = False  # the part after a mapping field is a key the user chose (``aliases.<name>``), not a field
    for part in loc:
        if model is None:
            return None
        if isinstance(part, int) or keyed:
            keyed = False
            continue
        field = _field_by_key(model, part)
        model = _model_of(field.annotation) if field is not None else None
        keyed = field is not None and typing.get_origin(field.annotation) is dict
    return model


def _allowed_keys(root: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    model = _model_at(root, loc)
    if model is None:
        return []
    return sorted(f.alias or n for n, f in model.model_fields.items())


def _renamed(root: type[BaseModel], loc: tuple[int | str, ...], key: str) -> str | None:
    """The camelCase key when ``key`` is a field's Python (snake_case) name refused in a stack file."""
    model = _model_at(root, loc)
    if model is None or key not in model.model_fields:
        return None
    alias = model.model_fields[key].alias
    return alias if alias and alias != key else None


def _field_by_key(model: type[BaseModel], key: str) -> Any:
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
