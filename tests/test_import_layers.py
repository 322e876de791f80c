"""Every arrow points down: trainer <- platform (package ``lab``) <- dashboard.

The guard parses the source with ``ast`` (nothing is imported, so a lazy
import inside a function counts like any other) and fails on

* an upward import between the three rooms: the trainer importing ``lab``,
  ``dashboard`` or Django, or ``lab`` importing ``dashboard``;
* an import cycle between project modules. Imports under ``if TYPE_CHECKING:``
  are left out of the cycle check only: they never run, but they still may
  not point upward.

The Django site (``lab.site``) names the dashboard app and its URLs as
strings in INSTALLED_APPS and ``include("dashboard.web.urls")``: that is how a
composition root wires apps, not an import, so it is not an arrow.

The platform's contract with the trainer (docs/design.md section 1.1): the
platform and the dashboard import only the trainer modules listed in
``TRAINER_CONTRACT`` (torch-free: the web process loads them) and
``TRAINER_WORKER_ONLY`` (they load torch: imported inside the functions the
worker runs, or by worker-only modules). The web process (the WSGI module and
every view its URLs name) never imports torch, checked in a fresh interpreter.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

from import_graph import (
    ROOT,
    Edge,
    _imports,
    _is_type_checking,
    _resolve,
    import_edges,
    project_modules,
    strongly_connected,
)

RANK = {"trainer": 0, "integrations": 0, "lab": 1, "dashboard": 2}
FORBIDDEN_IN_TRAINER = ("django", "rest_framework", "celery")

# The trainer modules the platform may import (docs/design.md section 1.1), torch-free.
TRAINER_CONTRACT = frozenset(
    {
        "trainer.analysis",
        "trainer.analysis.intervals",
        "trainer.analysis.power",
        "trainer.analysis.survival",
        "trainer.analysis.run_record",
        "trainer.analysis.collapse",
        "trainer.config",
        "trainer.errors",
        "trainer.hf.families",
        "trainer.hf.files",
        "trainer.hf.tokenizer",
        "trainer.hf.validate",
        "trainer.hf.weights",
        "trainer.metric_keys",
        "trainer.model.param_count",
        "trainer.config.presets",
        "trainer.run_folder.files",
        "trainer.run_folder.guard",
        "trainer.studies.definition",
        "trainer.analysis.kaplan_meier",
        "trainer.tasks.factory",
        "trainer.tasks.text_data",
        "trainer.tasks.verifiers",
        "trainer.reward_functions",
        "trainer.hf.finite",
        "trainer.validation",
        "trainer.run_folder.warmstart_progress",
        "trainer.launch",
        "trainer.devices.packing",
    }
)
# ... and those that load torch: only inside worker code paths.
TRAINER_WORKER_ONLY = frozenset(
    {
        "trainer.run.export",
        "trainer.hf.loader",
        "trainer.model.transformer",
    }
)
# Platform modules that run only in the worker (the trainer's supervisor), where
# a module-level import of a worker-only trainer module is fine.
WORKER_MODULES = ("lab.jobs.supervisor",)


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
        if _room(module) in ("trainer", "integrations")
        and name.split(".")[0] in FORBIDDEN_IN_TRAINER
    ]
    return bad


def import_cycles() -> list[list[str]]:
    """Strongly connected components of more than one module."""
    graph: dict[str, set[str]] = {}
    for e in import_edges()[0]:
        if not e.type_only:
            graph.setdefault(e.source, set()).add(e.target)
    return strongly_connected(graph)


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
        "def f():\n    import dashboard.web.views\n"
    )
    found = list(_imports(ast.parse(source), "trainer.pkg.mod", is_package=False))
    assert ("trainer.pkg.sibling", 2, False) in found
    assert ("trainer.config.ExperimentConfig", 4, True) in found
    assert ("dashboard.web.views", 6, False) in found


def _module_level_imports(tree: ast.AST) -> set[str]:
    """Names imported when the module loads: not inside a function body."""
    found: set[str] = set()

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                continue
            if isinstance(child, ast.If) and _is_type_checking(child):
                continue
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and not child.level:
                found.update(f"{child.module}.{alias.name}" for alias in child.names)
            else:
                walk(child)

    walk(tree)
    return found


def _platform_trainer_imports() -> list[Edge]:
    return [
        e
        for e in import_edges()[0]
        if _room(e.target) == "trainer"
        and _room(e.source) not in ("trainer", "integrations")  # integrations: not the platform
        and not e.type_only
    ]


def test_platform_imports_only_the_trainer_contract():
    allowed = TRAINER_CONTRACT | TRAINER_WORKER_ONLY
    outside = [f"{e.source}:{e.line} imports {e.target}" for e in _platform_trainer_imports()
               if e.target not in allowed]  # fmt: skip
    assert outside == [], "add the module to the contract (docs/design.md 1.1) or import less"


def test_worker_only_trainer_modules_load_only_in_worker_code():
    """A module-level import of a torch-loading trainer module would load torch in
    every process that imports the platform module: only worker modules may."""
    modules = project_modules()
    bad = []
    for module, path in modules.items():
        if _room(module) == "trainer" or module.startswith(WORKER_MODULES):
            continue
        for name in _module_level_imports(ast.parse(path.read_text())):
            target = _resolve(name, modules)
            if target in TRAINER_WORKER_ONLY:
                bad.append(f"{module} imports {target} at module level")
    assert bad == []


def _run_fresh(code: str, tmp_path: Path) -> str:
    env = {
        **os.environ,
        "LAB_VAR_DIR": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "lab.site.settings",
    }
    env.pop("DATABASE_URL", None)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


def test_the_trainer_contract_imports_without_torch(tmp_path):
    names = ", ".join(sorted(TRAINER_CONTRACT))
    code = f"import sys\nimport {names}\nprint(sorted(m for m in sys.modules if m.split('.')[0] == 'torch')[:3])"
    assert _run_fresh(code, tmp_path) == "[]"


def test_the_web_process_never_imports_torch(tmp_path):
    """The WSGI module, then every view its URLs name (what the first request loads)."""
    code = (
        "import sys\n"
        f"sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'platform')!r}]\n"
        "from lab.site.wsgi import application\n"
        "from django.urls import get_resolver\n"
        "def walk(patterns):\n"
        "    for p in patterns:\n"
        "        yield from walk(p.url_patterns) if hasattr(p, 'url_patterns') else [p.callback]\n"
        "views = list(walk(get_resolver().url_patterns))\n"
        "print(len(views), 'torch' in sys.modules)"
    )
    count, torch_loaded = _run_fresh(code, tmp_path).split()
    assert int(count) > 40 and torch_loaded == "False"


def test_design_doc_lists_the_trainer_contract():
    text = (ROOT / "docs" / "design.md").read_text()
    section = text.split("### 1.1 ", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"^\| `(trainer(?:\.\w+)+)` \|", section, re.MULTILINE))
    assert named == TRAINER_CONTRACT | TRAINER_WORKER_ONLY


# --------------------------------------------------------------------------- lab packages
# docs/design.md 1.2: a lab package (or top-level lab module) imports only those to
# its left: the text rule, the assets, the one config gate, then the concepts.
LAB_ORDER = (
    "text",
    "inputs",
    "assets",
    "configs",
    "experiments",
    "runs",
    "jobs",
    "api",
    "tracking",
)


def _lab_package(module: str) -> str | None:
    """``lab.runs.lifecycle`` -> ``runs``; None outside lab's ordered packages and for
    the entry points (the site and the management commands wire the packages)."""
    parts = module.split(".")
    if parts[0] != "lab" or len(parts) < 2 or "management" in parts:
        return None
    return parts[1] if parts[1] in LAB_ORDER else None


def lab_upward_imports() -> list[str]:
    """Imports (lazy ones included, type-only ones not) from a lab package to one
    on its right in LAB_ORDER."""
    found = []
    for e in import_edges()[0]:
        source, target = _lab_package(e.source), _lab_package(e.target)
        if not source or not target or source == target or e.type_only:
            continue
        if LAB_ORDER.index(target) > LAB_ORDER.index(source):
            found.append(f"{e.source}:{e.line} -> {e.target}")
    return sorted(found)


def test_every_lab_package_is_in_the_order():
    packages = {
        path.name
        for path in (ROOT / "platform" / "lab").iterdir()
        if (path / "__init__.py").exists() and path.name not in ("site", "templates")
    }
    assert packages <= set(LAB_ORDER), f"place {packages - set(LAB_ORDER)} in LAB_ORDER"


def test_lab_packages_import_only_to_their_left():
    """So no two lab packages import each other (no package cycle)."""
    assert lab_upward_imports() == []
