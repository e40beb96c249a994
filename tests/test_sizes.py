"""Sizes a newcomer can read at a glance: no module over 400 lines and no function over 60 outside tests/ and
bench/ (docs/architecture.md, "Rooms")."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_layers import FLOORS, ROOT

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _sources() -> list[Path]:
    return sorted(p for package in FLOORS for p in (ROOT / package).rglob("*.py"))


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int]]:
    """(name, lines) of every function or method in ``source`` longer than ``limit`` lines, decorators aside."""
    return [
        (node.name, lines)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (lines := (node.end_lineno or node.lineno) - node.lineno + 1) > limit
    ]


def test_long_functions_finds_a_function_one_line_over_and_not_one_at_the_limit() -> None:
    at_limit = "def ok():\n" + "    x = 1\n" * 59
    over = "def long():\n" + "    x = 1\n" * 60
    assert long_functions(at_limit) == []
    assert long_functions(at_limit + over) == [("long", 61)]


def test_no_module_is_over_400_lines() -> None:
    big = {str(p.relative_to(ROOT)): n for p in _sources() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert big == {}


def test_no_function_is_over_60_lines() -> None:
    found = {str(p.relative_to(ROOT)): long for p in _sources() if (long := long_functions(p.read_text()))}
    assert found == {}
