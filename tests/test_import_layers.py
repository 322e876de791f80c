"""Every arrow points down: trainer <- platform (package ``lab``) <- dashboard.

The guard parses the source with ``ast`` (nothing is imported, so a lazy
import inside a function counts like any other) and fails on

* an upward import between the three rooms: the trainer importing ``lab``,
  ``dashboard`` or Django, or ``lab`` importing ``dashboard``;
* an import cycle between project modules. Imports under ``if TYPE_CHECKING:``
  are left out of the cycle check only: they never run, but they still may
  not point upward.

The Django site (``lab.site``) names the dashboard app and its URLs as
strings in INSTALLED_APPS and ``include("dashboard.urls")``: that is how a
composition root wires apps, not an import, so it is not an arrow.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Source folder -> top-level package, lowest room first.
ROOMS = {
    "trainer": ROOT / "trainer",
    "lab": ROOT / "platform" / "lab",
    "dashboard": ROOT / "dashboard",
}
RANK = {"trainer": 0, "lab": 1, "dashboard": 2}
FORBIDDEN_IN_TRAINER = ("django", "rest_framework", "celery")


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


def _room(module: str) -> str:
    return module.split(".")[0]


def upward_imports() -> list[str]:
    edges, external = import_edges()
    bad = [
        f"{e.source}:{e.line} imports {e.target}"
        for e in edges
        if RANK[_room(e.target)] > RANK[_room(e.source)]
    ]
    bad += [
        f"{module}:{line} imports {name}"
        for module, name, line in external
        if _room(module) == "trainer" and name.split(".")[0] in FORBIDDEN_IN_TRAINER
    ]
    return bad


def import_cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for e in import_edges()[0]:
        if not e.type_only:
            graph.setdefault(e.source, set()).add(e.target)
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
        for nxt in graph.get(node, ()):
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


def test_no_upward_import_between_rooms():
    assert upward_imports() == []


def test_no_import_cycle():
    assert import_cycles() == []


def test_guard_sees_lazy_relative_and_type_only_imports(tmp_path):
    """The parser itself: a lazy import counts, a relative import resolves, a
    TYPE_CHECKING import is marked type-only."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "from . import sibling\n"
        "if TYPE_CHECKING:\n    from trainer.config import ExperimentConfig\n"
        "def f():\n    import dashboard.views\n"
    )
    found = list(_imports(ast.parse(source), "trainer.pkg.mod", is_package=False))
    assert ("trainer.pkg.sibling", 2, False) in found
    assert ("trainer.config.ExperimentConfig", 4, True) in found
    assert ("dashboard.views", 6, False) in found
