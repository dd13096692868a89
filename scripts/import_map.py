#!/usr/bin/env python3
"""The package's import map, read from the source (AST only: nothing is imported or run).

A room is a top-level package of ``kinesumer/`` (``group/``, ``read/``...) or a module at its
root (``config``, ``errors``...). Every ``import`` counts, those under ``TYPE_CHECKING`` and
inside functions too: a circle there is a circle in the design.

    .venv/bin/python scripts/import_map.py          the rooms, floor by floor, lowest first
    .venv/bin/python scripts/import_map.py --check  exit 1 on a circle of files or rooms, or a
                                                    library module importing kinesumer.testing

A room's floor is one above the highest room it imports, so every arrow runs down.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "kinesumer"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> list[tuple[str, list[str]]]:
    """``path``'s imports as (absolute module, the names taken from it)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            found.append((target, [alias.name for alias in node.names]))
    return [(m, names) for m, names in found if m == "kinesumer" or m.startswith("kinesumer.")]


def faces(paths: dict[str, Path]) -> dict[str, dict[str, str]]:
    """For each package, the module each name its ``__init__`` hands on comes from: a
    package's face re-exports, so an import through it is an import of that module."""
    found: dict[str, dict[str, str]] = {}
    for name, path in paths.items():
        if path.name == "__init__.py":
            found[name] = {n: m for m, names in imports_of(path) for n in names if m != name}
    return found


def resolve(module: str, name: str, paths: dict[str, Path], face: dict[str, dict[str, str]]) -> str:
    """The module that ``from module import name`` really takes something from."""
    seen = set()
    while f"{module}.{name}" not in paths and name in face.get(module, {}) and module not in seen:
        seen.add(module)
        module = face[module][name]
    return f"{module}.{name}" if f"{module}.{name}" in paths else module


def room_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "kinesumer"
    return f"{parts[1]}/" if (PACKAGE / parts[1]).is_dir() else parts[1]


def files() -> dict[str, set[str]]:
    """Each library module and the library modules it imports, an import through a package's
    face counted as one of the module the name comes from."""
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    face = faces(paths)
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        targets: set[str] = set()
        for module, names in imports_of(path):
            if path.name == "__init__.py" and module.startswith(name + "."):
                continue  # a face handing on its own package's names
            for imported in names or [""]:
                target = resolve(module, imported, paths, face) if imported else module
                if target in paths and target != name:
                    targets.add(target)
        graph[name] = targets
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def rooms(modules: dict[str, set[str]]) -> dict[str, set[str]]:
    """Room -> the rooms it imports. The package's own ``__init__`` (its public face, which
    re-exports from every room) is left out."""
    graph: dict[str, set[str]] = defaultdict(set)
    for module, targets in modules.items():
        source = room_of(module)
        if source == "kinesumer":
            continue
        graph[source]
        for target in targets:
            if room_of(target) not in (source, "kinesumer"):
                graph[source].add(room_of(target))
    return graph


def floors(graph: dict[str, set[str]]) -> dict[str, int]:
    floor: dict[str, int] = {}

    def of(room: str) -> int:
        if room not in floor:
            floor[room] = 0  # a circle stops here; --check reports it
            floor[room] = 1 + max((of(r) for r in graph.get(room, ())), default=0)
        return floor[room]

    for room in graph:
        of(room)
    return floor


def problems(modules: dict[str, set[str]]) -> list[str]:
    found = [f"circle of files: {' '.join(c)}" for c in circles(modules)]
    found += [f"circle of rooms: {' '.join(c)}" for c in circles(rooms(modules))]
    found += [
        f"{module} imports {target}: the library must not import its testing helpers"
        for module, targets in sorted(modules.items())
        if not module.startswith("kinesumer.testing")
        for target in sorted(targets)
        if target.startswith("kinesumer.testing")
    ]
    return found


def main() -> int:
    global ROOT, PACKAGE
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 on a circle")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout (default: this one)")
    args = parser.parse_args()
    ROOT, PACKAGE = args.root.resolve(), args.root.resolve() / "kinesumer"
    modules = files()
    found = problems(modules)
    if not args.check:
        graph = rooms(modules)
        by_floor: dict[int, list[str]] = defaultdict(list)
        for room, level in floors(graph).items():
            by_floor[level].append(room)
        for level in sorted(by_floor):
            for room in sorted(by_floor[level]):
                below = ", ".join(sorted(graph[room])) or "-"
                print(f"floor {level:2}  {room:<16} imports {below}")
    for problem in found:
        print(problem)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
