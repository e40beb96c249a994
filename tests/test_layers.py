"""The import graph: no circle, and no import from a lower floor up to a higher one; and docs/architecture.md's
package table names every package and every room of the ground floor."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Each package's floor: a package imports only from floors below its own. `fleet/` is the ground floor; the
# product's CLI (`llmfleet/`) is the top floor, the only one that may know every component.
FLOORS = {
    "fleet": 0,
    "agent": 1,
    "engine_sim": 1,
    "gateway": 1,
    "rollout": 2,
    "control_plane": 3,
    "simulate": 5,
    "infra": 5,
    "policies": 6,
    "llmfleet": 7,
}
PACKAGES = tuple(FLOORS)
# The list of shipped plugins is the top floor's, but the Pulumi program, the policy pack and the simulator check
# whole stacks against it too: it sits on a floor of its own, above every component it lists.
MODULE_FLOORS = {"llmfleet.registries": 4}


def floor(module: str) -> int:
    return MODULE_FLOORS.get(module, FLOORS[module.split(".")[0]])


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


def test_the_import_graph_has_no_circle() -> None:
    assert circles(graph()) == set()


def upward(edges: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Every import into another package on the same floor or a higher one."""
    return {
        (module, target)
        for module, targets in edges.items()
        for target in targets
        if module.split(".")[0] != target.split(".")[0] and floor(target) >= floor(module)
    }


def test_upward_finds_an_import_up_or_sideways_and_only_those() -> None:
    edges = {
        "fleet.x": {"gateway.y"},
        "gateway.y": {"agent.z", "fleet.x"},
        "llmfleet.cli": {"gateway.y"},
        "infra.z": {"llmfleet.registries"},
        "control_plane.w": {"llmfleet.registries"},
    }
    assert upward(edges) == {
        ("fleet.x", "gateway.y"),
        ("gateway.y", "agent.z"),
        ("control_plane.w", "llmfleet.registries"),
    }


def test_no_package_imports_from_its_own_floor_or_above() -> None:
    assert upward(graph()) == set()


def test_every_package_has_a_floor() -> None:
    found = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists() and p.name != "tests"}
    assert sorted(found) == sorted(FLOORS)


def _table() -> dict[str, str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| `([a-z_]+)/` \| (.*) \| (?:yes|no) \|$", text, re.M)
    return dict(rows)


def _rooms() -> dict[str, tuple[int, set[str]]]:
    """docs/architecture.md's rooms table: folder -> (floor, the modules it names)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| `([a-z_/]+)/` \| (\d) \| [^|]* \| (.*) \|$", text, re.M)
    return {folder: (int(level), set(re.findall(r"`([a-z0-9_]+\.py)`", modules))) for folder, level, modules in rows}


def _folders() -> dict[str, set[str]]:
    """Every package folder of the tree (tests/ aside) -> the modules directly in it."""
    out = {}
    for init in ROOT.glob("*/**/__init__.py"):
        folder = init.parent.relative_to(ROOT).as_posix()
        if folder.split("/")[0] in FLOORS:
            out[folder] = {p.name for p in init.parent.glob("*.py") if p.name != "__init__.py"}
    return out


def test_the_architecture_table_names_every_package() -> None:
    assert sorted(_table()) == sorted(PACKAGES)


def test_the_rooms_table_has_a_row_for_every_package_folder_and_no_other() -> None:
    assert sorted(_rooms()) == sorted(_folders())


def test_each_room_row_names_exactly_the_modules_in_its_folder() -> None:
    rooms = _rooms()
    wrong = {
        folder: {"missing": sorted(present - rooms[folder][1]), "gone": sorted(rooms[folder][1] - present)}
        for folder, present in _folders().items()
        if folder in rooms and rooms[folder][1] != present
    }
    assert wrong == {}


def test_each_room_row_gives_its_packages_floor() -> None:
    wrong = {folder: level for folder, (level, _) in _rooms().items() if level != FLOORS[folder.split("/")[0]]}
    assert wrong == {}
