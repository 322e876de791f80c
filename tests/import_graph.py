"""The project's import graph, parsed with ``ast`` (nothing is imported, so a
lazy import inside a function counts like any other): the modules of each room,
the edges between them, and the cycles of a graph. Shared by the import guards
(tests/test_import_layers.py, tests/test_package_order.py)."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Source folder -> top-level package, lowest room first.
ROOMS = {
    "trainer": ROOT / "trainer",
    "lab": ROOT / "platform" / "lab",
    "dashboard": ROOT / "dashboard",
    # callbacks that run inside other frameworks' training jobs: the trainer's formulas at
    # most, never Django, the lab or the dashboard
    "integrations": ROOT / "integrations",
}


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    type_only: bool


def _module_name(package: str, folder: Path, path: Path) -> str:
    parts = [package, *path.relative_to(folder).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def project_modules() -> dict[str, Path]:
    modules = {}
    for package, folder in ROOMS.items():
        for path in folder.rglob("*.py"):
            if "migrations" in path.parts:
                continue
            modules[_module_name(package, folder, path)] = path
    return modules


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, module: str, is_package: bool):
    """Yield (imported dotted name, line, type_only) for every import in the tree."""

    def walk(node: ast.AST, type_only: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for stmt in child.body:
                    yield from walk_stmt(stmt, True)
                for stmt in child.orelse:
                    yield from walk_stmt(stmt, type_only)
                continue
            yield from walk_stmt(child, type_only)

    def walk_stmt(node: ast.AST, type_only: bool):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno, type_only
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                yield f"{base}.{alias.name}", node.lineno, type_only
        else:
            yield from walk(node, type_only)

    yield from walk(tree, False)


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The longest project module that ``name`` (module or module.attribute) names."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


@cache
def import_edges() -> tuple[list[Edge], list[tuple[str, str, int]]]:
    """Project-internal edges, and (module, external name, line) for outside imports."""
    modules = project_modules()
    edges, external = [], []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        for name, line, type_only in _imports(tree, module, is_package):
            target = _resolve(name, modules)
            if target is None:
                external.append((module, name, line))
            elif target != module:
                edges.append(Edge(module, target, line, type_only))
    return edges, external


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def connect(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                connect(nxt)
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
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return cycles
