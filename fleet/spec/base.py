"""Spec base: the frozen, camelCase model every stack key is parsed into, and the patterns keys share."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

__all__ = ["KEY_HASH", "Name", "PluginRef", "Spec"]

_NAME = r"^[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?$"
Name = Annotated[str, Field(pattern=_NAME, description="lowercase DNS label: letters, digits, '-'")]
KEY_HASH = re.compile(r"^sha256:[0-9a-f]{64}$")
_DIGEST = r"^sha256:[0-9a-f]{64}$"
_ACM_ARN = r"^arn:aws[a-z-]*:acm:[a-z0-9-]+:\d{12}:certificate/[0-9a-f-]+$"
_REVISION = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
_KEY_PREFIX = r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*$"
# A registry host (and port) with an optional path, e.g. ghcr.io/acme/llmfleet: no tag, no digest.
_REGISTRY = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?(:\d+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*$"


class Spec(BaseModel):
    """Base of every spec model: frozen, camelCase aliases, unknown keys rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        validate_default=True,
        use_attribute_docstrings=True,
    )


class PluginRef(Spec):
    """A plugin chosen by name with parameters, e.g. ``{name: queue-depth, weight: 2, params: {...}}``."""

    name: str
    weight: float = Field(default=1.0, ge=0.0, le=100.0)
    params: dict[str, Any] = Field(default_factory=dict)
