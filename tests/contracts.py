"""Contracts: the routes docs/architecture.md ("## Contracts") promises per component, and the routes an OpenAPI
document declares, as comparable sets of (METHOD, path)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ARCHITECTURE = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"

# A backticked route in a bullet: `/healthz` (a GET) or `POST /drain`; backticked names like `fleet.protocol.wire.X`
# are not.
_ROUTE = re.compile(r"`(?:(GET|POST|PUT|PATCH|DELETE) )?(/[^`\s?]*)[^`]*`")


def documented_routes(component: str, text: str | None = None) -> set[tuple[str, str]]:
    """The routes of the ``* **component**:`` bullet of the Contracts section (a bullet runs to the next one)."""
    text = ARCHITECTURE.read_text() if text is None else text
    section = text.split("\n## Contracts\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(rf"^\* \*\*{re.escape(component)}\*\*[^:\n]*:(.*?)(?=^\* |^$)", section, re.MULTILINE | re.DOTALL)
    if match is None:
        raise AssertionError(f"docs/architecture.md has no '* **{component}**:' bullet under ## Contracts")
    return {(method or "GET", path) for method, path in _ROUTE.findall(match.group(1))}


def declared_routes(openapi: dict[str, Any]) -> set[tuple[str, str]]:
    return {(method.upper(), path) for path, operations in openapi["paths"].items() for method in operations}


def error_schemas(openapi: dict[str, Any]) -> dict[tuple[str, str, str], str]:
    """(METHOD, path, status) -> the $ref of every 4xx response an OpenAPI document declares."""
    return {
        (method.upper(), path, status): response["content"]["application/json"]["schema"].get("$ref", "")
        for path, operations in openapi["paths"].items()
        for method, operation in operations.items()
        for status, response in operation["responses"].items()
        if status.startswith("4")
    }
