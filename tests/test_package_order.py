"""Package orders inside the rooms, and no package cycle anywhere in the product.

docs/design.md 1.2 (``lab``, whose order is ``LAB_ORDER`` in
tests/test_import_layers.py), 1.3 (the trainer) and 1.4 (the dashboard): a
package, or a loose module at the room's top level, imports only those on its
left. Lazy imports count (the graph is parsed, nothing is imported); imports
under ``TYPE_CHECKING`` never run and are left out. With the orders and the
module-cycle check, no two packages at any depth import each other, which
``test_no_package_cycle_at_any_depth`` checks directly.
"""

from __future__ import annotations

import re

from import_graph import ROOT, import_edges, project_modules, strongly_connected

# docs/design.md 1.3, lowest first: the contracts (bad input, metric keys, the
# torchrun command, the rule of which reward functions may run, the bounded
# child process that runs user-supplied code), the pure formulas, the schema, the tasks and the one gate a
# config passes, the run folder's contract, what a device can do, the model, the
# rollout engine, the distributed seam, the stabilizers, Hugging Face import and
# export, the statistics of runs, the loop, the studies, the command line.
TRAINER_ORDER = (
    "errors",
    "metric_keys",
    "launch",
    "reward_functions",
    "sandbox",
    "algorithms",
    "config",
    "tasks",
    "validation",
    "run_folder",
    "devices",
    "model",
    "rollout",
    "distributed",
    "stabilizers",
    "hf",
    "analysis",
    "run",
    "studies",
    "cli",
    "__main__",
)

# docs/design.md 1.4: the charts (pure: series in, figure out), team review's
# models, services and the pages' reads, then the pages.
DASHBOARD_ORDER = ("charts", "review", "web")
# What the charts never import: they run without Django settings.
NOT_IN_CHARTS = ("django", "rest_framework", "celery", "lab")


def _top(module: str, room: str) -> str | None:
    """``trainer.run.runner`` -> ``run``; None outside the room and for the room's
    own ``__init__``."""
    parts = module.split(".")
    return parts[1] if parts[0] == room and len(parts) > 1 else None


def order_violations(room: str, order: tuple[str, ...]) -> list[str]:
    """Imports (lazy ones included, type-only ones not) from a part of ``room`` to
    one on its right in ``order``."""
    found = []
    for e in import_edges()[0]:
        source, target = _top(e.source, room), _top(e.target, room)
        if e.type_only or source is None or target is None or source == target:
            continue
        if source in order and target in order and order.index(target) > order.index(source):
            found.append(f"{e.source}:{e.line} -> {e.target}")
    return sorted(found)


def room_parts(room: str) -> set[str]:
    return {part for module in project_modules() if (part := _top(module, room))}


def test_every_trainer_part_is_in_the_order():
    missing = room_parts("trainer") - set(TRAINER_ORDER)
    assert not missing, f"place {sorted(missing)} in TRAINER_ORDER (docs/design.md 1.3)"


def test_trainer_parts_import_only_to_their_left():
    assert order_violations("trainer", TRAINER_ORDER) == []


def drawn_order(section: str) -> tuple[str, ...]:
    """The order docs/design.md draws in ``section`` as names joined by ``<-``."""
    text = (ROOT / "docs" / "design.md").read_text().split(f"### {section} ", 1)[1]
    text = text.split("\n#", 1)[0]
    line = re.search(r"^```\n(.+?)\n```", text, re.MULTILINE | re.DOTALL).group(1)
    return tuple(name.strip() for name in " ".join(line.split("\n")).split("<-"))


def test_design_doc_states_the_orders():
    assert drawn_order("1.3") == TRAINER_ORDER
    assert drawn_order("1.4") == DASHBOARD_ORDER


def test_every_dashboard_part_is_in_the_order():
    missing = room_parts("dashboard") - set(DASHBOARD_ORDER)
    assert not missing, f"place {sorted(missing)} in DASHBOARD_ORDER (docs/design.md 1.4)"


def test_dashboard_parts_import_only_to_their_left():
    assert order_violations("dashboard", DASHBOARD_ORDER) == []


def test_the_charts_import_no_django_and_no_lab():
    edges, external = import_edges()
    bad = [f"{e.source}:{e.line} -> {e.target}" for e in edges
           if e.source.startswith("dashboard.charts") and e.target.startswith("lab.")]  # fmt: skip
    bad += [f"{module}:{line} -> {name}" for module, name, line in external
            if module.startswith("dashboard.charts") and name.split(".")[0] in NOT_IN_CHARTS]  # fmt: skip
    assert bad == []


def package_cycles() -> list[list[str]]:
    """Cycles between packages at every depth: each module stands for its package
    at that depth (``lab.runs.metrics.read`` is ``lab.runs`` at depth 2), a loose
    module for itself. Type-only imports are left out."""
    edges = [e for e in import_edges()[0] if not e.type_only]
    depth = max(len(module.split(".")) for module in project_modules())
    cycles = []
    for d in range(1, depth):
        graph: dict[str, set[str]] = {}
        for e in edges:
            source = ".".join(e.source.split(".")[:d])
            target = ".".join(e.target.split(".")[:d])
            if (
                source != target
                and not target.startswith(source + ".")
                and not (source.startswith(target + "."))
            ):
                graph.setdefault(source, set()).add(target)
        cycles += strongly_connected(graph)
    return cycles


def test_no_package_cycle_at_any_depth():
    assert package_cycles() == []


def test_the_site_is_imported_by_no_room_below_it():
    """``lab.site`` is the composition root: settings, URLs, the Celery app. The
    packages below it publish through ``celery.current_app``."""
    bad = [f"{e.source}:{e.line} -> {e.target}" for e in import_edges()[0]
           if e.target.startswith("lab.site") and not e.source.startswith("lab.site")]  # fmt: skip
    assert bad == []
