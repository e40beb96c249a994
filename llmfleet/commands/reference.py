"""Reference: render the configuration reference (every key, type, default, allowed range) from FleetSpec.

``docs/configuration.md`` embeds this output between two markers, and each plugin's parameters (from the
registries it is given) between two more; a test keeps both in step with the models. Run
``python -m llmfleet.commands.reference --write`` after changing the spec or a plugin's ``Params``.
"""

from __future__ import annotations

import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal

from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from fleet.spec.plugins import PARAMETRISED_KINDS, Registry
from fleet.spec.stack import FleetSpec

__all__ = ["BEGIN", "END", "PLUGINS_BEGIN", "PLUGINS_END", "render_plugin_reference", "render_reference"]

BEGIN = "<!-- BEGIN GENERATED REFERENCE -->"
END = "<!-- END GENERATED REFERENCE -->"
PLUGINS_BEGIN = "<!-- BEGIN GENERATED PLUGIN PARAMETERS -->"
PLUGINS_END = "<!-- END GENERATED PLUGIN PARAMETERS -->"
DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def render_reference() -> str:
    lines = [
        "| key | type | default | allowed | meaning |",
        "|---|---|---|---|---|",
    ]
    for path, info in _walk(FleetSpec, "llmfleet:"):
        lines.append(
            f"| `{path}` | {_type(info.annotation)} | {_default(info)} | {_allowed(info)} | {_meaning(info)} |"
        )
    return "\n".join(lines)


def render_plugin_reference(registries: typing.Sequence[Registry[Any]]) -> str:
    """Every parameter of every plugin that takes a ``params`` block, by kind and name (camelCase keys)."""
    lines = [
        "| kind | plugin | parameter | type | default | allowed | meaning |",
        "|---|---|---|---|---|---|---|",
    ]
    by_kind = {r.kind: r for r in registries}
    for kind in PARAMETRISED_KINDS:
        registry = by_kind.get(kind)
        if registry is None:
            continue
        for name in registry.names():
            fields = registry.params_model(name).model_fields
            if not fields:
                lines.append(f"| {kind} | `{name}` | none |  |  |  |  |")
            for field, info in fields.items():
                lines.append(
                    f"| {kind} | `{name}` | `{info.alias or field}` | {_type(info.annotation)} | {_default(info)} "
                    f"| {_allowed(info)} | {_meaning(info)} |"
                )
    return "\n".join(lines)


def _walk(model: type[BaseModel], prefix: str) -> typing.Iterator[tuple[str, FieldInfo]]:
    for name, info in model.model_fields.items():
        key = info.alias or name
        path = f"{prefix}{key}" if prefix.endswith(":") else f"{prefix}.{key}"
        nested = _nested_model(info.annotation)
        if nested is not None:
            origin = typing.get_origin(info.annotation)
            yield path, info
            yield from _walk(nested, path + ("[]" if origin is list else ".<name>" if origin is dict else ""))
        else:
            yield path, info


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def _type(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return "enum"
    if origin in (types.UnionType, typing.Union):
        return " or ".join(_type(a) for a in typing.get_args(annotation) if a is not type(None)) + " (optional)"
    if origin is list:
        return f"list of {_type(typing.get_args(annotation)[0])}"
    if origin is dict:
        return "mapping"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "object"
    if origin is typing.Annotated:
        return _type(typing.get_args(annotation)[0])
    return getattr(annotation, "__name__", str(annotation)).replace("time", "time (HH:MM)")


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "**required**"
    if info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]
        if isinstance(value, BaseModel):
            return "(see below)"
        if isinstance(value, list) and value and isinstance(value[0], BaseModel):
            return ", ".join(str(v.model_dump().get("name")) for v in value)
        return f"`{value!r}`" if value not in ([], {}) else "empty"
    if info.default is None or info.default is PydanticUndefined:
        return "unset"
    if isinstance(info.default, BaseModel):
        return "(see below)"
    return f"`{info.default}`"


def _allowed(info: FieldInfo) -> str:
    parts: list[str] = []
    annotation = info.annotation
    for arg in (annotation, *typing.get_args(annotation)):
        if typing.get_origin(arg) is Literal:
            parts.append(" \\| ".join(f"`{v}`" for v in typing.get_args(arg)))
    metadata = list(info.metadata)
    if typing.get_origin(annotation) is typing.Annotated:
        metadata += list(typing.get_args(annotation)[1:])
    for item in metadata:
        if isinstance(item, Ge):
            parts.append(f">= {item.ge}")
        elif isinstance(item, Gt):
            parts.append(f"> {item.gt}")
        elif isinstance(item, Le):
            parts.append(f"<= {item.le}")
        elif isinstance(item, Lt):
            parts.append(f"< {item.lt}")
        elif isinstance(item, MinLen):
            parts.append(f"at least {item.min_length} item(s)")
        elif isinstance(item, MaxLen):
            parts.append(f"at most {item.max_length} item(s)")
        elif getattr(item, "pattern", None):
            parts.append(f"pattern `{item.pattern}`")
    return ", ".join(parts) or "any"


def _meaning(info: FieldInfo) -> str:
    return (info.description or "").replace("\n", " ").replace("|", "\\|")


def _replace(text: str, begin: str, end: str, body: str) -> str:
    head, _, rest = text.partition(begin)
    _, _, tail = rest.partition(end)
    return f"{head}{begin}\n{body}\n{end}{tail}"


def _write() -> None:
    from llmfleet.registries import all_registries  # the edge: this command documents every component

    text = _replace(DOC.read_text(), BEGIN, END, render_reference())
    DOC.write_text(_replace(text, PLUGINS_BEGIN, PLUGINS_END, render_plugin_reference(all_registries())))


if __name__ == "__main__":
    if "--write" in sys.argv:
        _write()
    else:
        print(render_reference())
