"""Reference: render the configuration reference (every key, type, default, allowed range) from FleetSpec.

``docs/configuration.md`` embeds this output between two markers; a test keeps it in step with the model.
Run ``python -m fleet.reference --write`` after changing the spec.
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

from fleet.spec import FleetSpec

__all__ = ["BEGIN", "END", "render_reference"]

BEGIN = "<!-- BEGIN GENERATED REFERENCE -->"
END = "<!-- END GENERATED REFERENCE -->"
DOC = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


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


def _walk(model: type[BaseModel], prefix: str) -> typing.Iterator[tuple[str, FieldInfo]]:
    for name, info in model.model_fields.items():
        key = info.alias or name
        path = f"{prefix}{key}" if prefix.endswith(":") else f"{prefix}.{key}"
        nested = _nested_model(info.annotation)
        if nested is not None:
            is_list = typing.get_origin(info.annotation) is list
            yield path, info
            yield from _walk(nested, path + ("[]" if is_list else ""))
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


def _write() -> None:
    text = DOC.read_text()
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    DOC.write_text(f"{head}{BEGIN}\n{render_reference()}\n{END}{tail}")


if __name__ == "__main__":
    if "--write" in sys.argv:
        _write()
    else:
        print(render_reference())
