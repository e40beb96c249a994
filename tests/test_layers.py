"""The import graph: no circle and no import from the ground floor (`fleet/`) up to a component, except the ones
listed here, which may only shrink; and docs/architecture.md's package table names every package and every
module of `fleet/`."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMPONENTS = ("agent", "autoscaler", "engine_sim", "gateway", "rollout", "simulate", "infra", "policies")
PACKAGES = ("fleet", *COMPONENTS)

# Known and not yet undone; each entry that no longer holds fails the test, so the list only shrinks.
KNOWN_CIRCLES: set[frozenset[str]] = set()
KNOWN_UPWARD = {  # fleet's CLI commands reach into the components whose plugins and SLO sources they list
    ("fleet.commands.registries", "agent.launchers"),
    ("fleet.commands.registries", "autoscaler.plugins"),
    ("fleet.commands.registries", "gateway.routing"),
    ("fleet.commands.slo", "autoscaler.budget_sources"),
}


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


def _imports(path: Path) -> Iterator[str]:
    """Every absolute import in the module, lazy and TYPE_CHECKING ones included: each is a dependency."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def graph() -> dict[str, set[str]]:
    modules = _modules()

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for target in _imports(path):
            found = owner(target)
            if found is not None and found != module and not module.startswith(found + "."):
                edges[module].add(found)
    return edges


def circles(edges: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.add(frozenset(component))
    return found


def test_circles_finds_a_circle_and_only_that() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {frozenset("abc")}
    assert circles({"a": {"b"}, "b": set()}) == set()


def test_the_import_graph_has_no_new_circle_and_the_known_ones_still_exist() -> None:
    assert circles(graph()) == KNOWN_CIRCLES


def test_the_ground_floor_imports_no_component_but_the_known_ones() -> None:
    upward = {
        (module, target)
        for module, targets in graph().items()
        if module.split(".")[0] == "fleet"
        for target in targets
        if target.split(".")[0] in COMPONENTS
    }
    assert upward == KNOWN_UPWARD


def _table() -> dict[str, str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| `([a-z_]+)/` \| (.*) \| (?:yes|no) \|$", text, re.M)
    return dict(rows)


def test_the_architecture_table_names_every_package() -> None:
    assert sorted(_table()) == sorted(PACKAGES)


def test_the_architecture_table_names_every_module_of_the_ground_floor() -> None:
    row = _table()["fleet"]
    named = set(re.findall(r"`([a-z_/]+?)(?:\.py|/)`", row))
    present = {p.stem for p in (ROOT / "fleet").glob("*.py") if p.stem != "__init__"}
    present |= {p.name for p in (ROOT / "fleet").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert sorted(present - named) == []
