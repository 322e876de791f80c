"""Guards for the two layout traps (docs/design.md section 1)."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_platform_folder_is_not_a_package():
    assert not (ROOT / "platform" / "__init__.py").exists()


def test_stdlib_platform_is_imported():
    import platform

    assert callable(platform.system)
    assert platform.system()


def test_stdlib_platform_wins_with_platform_folder_on_path():
    code = (
        "import sys; sys.path.insert(0, 'platform'); sys.path.insert(0, '.');"
        "import platform, uuid; assert platform.system(); print(uuid.uuid4())"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_trainer_never_imports_django():
    code = (
        "import sys, trainer, trainer.config, trainer.config.presets, trainer.metric_keys;"
        "import pkgutil, importlib;"
        "[importlib.import_module(m.name) for m in pkgutil.walk_packages(trainer.__path__, 'trainer.')"
        " if not m.name.endswith('__main__')];"
        "bad = [m for m in sys.modules if m == 'django' or m.startswith('django.')];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


# --- docs/design.md stays true: every pointer into it resolves, every path it names exists

DESIGN = ROOT / "docs" / "design.md"
POINTER_SOURCES = ("trainer", "platform", "dashboard", "tests", "bench", "scripts", "docs")
ROOT_FILES = ("README.md", "DEVELOPERS.md", "docker-compose.yml", "Dockerfile", "Makefile")


def _design_headings() -> list[tuple[str, str, int]]:
    """(number, title, level) of every heading of docs/design.md."""
    import re

    found = []
    for line in DESIGN.read_text().splitlines():
        match = re.match(r"^(#{2,3}) (\d+(?:\.\d+)?)\.? (.+)$", line)
        if match:
            found.append((match.group(2), match.group(3).strip(), len(match.group(1))))
    return found


def _design_pointers() -> list[tuple[str, str]]:
    """(file, the text after each "design.md"), line breaks and comment marks flattened."""
    import re

    files = [p for folder in POINTER_SOURCES for p in (ROOT / folder).rglob("*")
             if p.suffix in (".py", ".md", ".html", ".js", ".yml") and p != DESIGN
             and ".venv" not in p.parts]  # fmt: skip
    files += [ROOT / name for name in ROOT_FILES if (ROOT / name).exists()]
    pointers = []
    for path in files:
        text = re.sub(r"\s*\n\s*(?:#+\s*|\*\s*|//\s*)?", " ", path.read_text(errors="replace"))
        for match in re.finditer(r"design\.md", text):
            pointers.append((str(path.relative_to(ROOT)), text[match.end() : match.end() + 80]))
    return pointers


def test_every_pointer_into_design_md_resolves():
    """A section number must be a heading's; a quoted name ("data flow", or
    "contracts: CLI" for a section and its subsection) must be in a heading."""
    import re

    headings = _design_headings()
    numbers = {number for number, _, _ in headings}
    titles = [title.lower() for _, title, _ in headings]
    stale = []
    for path, after in _design_pointers():
        number = re.match(r"^[,)]?\s*(?:section\s+)?(\d+(?:\.\d+)?)\b", after)
        name = re.match(r'^(?:,\s*|\s+)(?:section\s+)?"([^"]+)"', after)
        if number and number.group(1) not in numbers:
            stale.append(f"{path}: section {number.group(1)}")
        if name and not all(any(part.strip().lower() in t for t in titles)
                            for part in name.group(1).split(":")):  # fmt: skip
            stale.append(f'{path}: "{name.group(1)}"')
        if not number and not name and re.match(r"^,\s*\w", after):
            stale.append(f"{path}: unquoted section name {after[:30]!r}")
    assert stale == []


def test_every_repository_path_design_md_names_exists():
    import glob
    import re

    missing = []
    for token in re.findall(r"`([^`\s]+)`", DESIGN.read_text()):
        top = token.split("/")[0]
        if "/" not in token and token not in (*ROOT_FILES, "pyproject.toml", "manage.py"):
            continue
        if top not in (*POINTER_SOURCES, "lab") and "/" in token:
            continue
        path = f"platform/{token}" if top == "lab" else token
        if not glob.glob(str(ROOT / path.split("<")[0].rstrip("/"))):
            missing.append(token)
    assert missing == []


# Django app labels as docs/design.md names models (``runs.Comment``) -> the models module.
APP_MODELS = {
    "experiments": "platform/lab/experiments/models.py",
    "runs": "platform/lab/runs/models.py",
    "jobs": "platform/lab/jobs/models.py",
    "assets": "platform/lab/assets/models.py",
    "tracking": "platform/lab/tracking/models.py",
    "dashboard": "dashboard/review/models.py",
}
RUN_FOLDER_FILES = (".log", ".json", ".jsonl", ".pt")


def _defines(path: Path, name: str) -> bool:
    """``name`` is bound at the top level of the module at ``path`` (a function, a
    class, an assignment or an import)."""
    import ast

    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if node.name == name:
                return True
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(getattr(t, "id", None) == name for t in targets):
                return True
        elif isinstance(node, ast.Import | ast.ImportFrom) and any(
            (a.asname or a.name.split(".")[0]) == name for a in node.names
        ):
            return True
    return False


def _module_file(dotted: str) -> Path | None:
    parts = dotted.split(".")
    base = ROOT / "platform" if parts[0] == "lab" else ROOT
    for candidate in (
        base.joinpath(*parts).with_suffix(".py"),
        base.joinpath(*parts, "__init__.py"),
    ):
        if candidate.exists():
            return candidate
    return None


def test_every_module_and_name_design_md_cites_exists():
    """Each dotted name in backticks (``trainer.run_folder.files``,
    ``trainer.analysis.collapse.rejudge_collapse``, ``lab.runs.exports.run_export``)
    is a module, or a name a module defines; ``label.Model`` is a model of that
    Django app. File names of the run folder (``trainer.log``) are not modules."""
    import re

    missing = []
    for token in sorted(set(re.findall(r"`([a-z_]+(?:\.[A-Za-z_]\w*)+)`", DESIGN.read_text()))):
        parts = token.split(".")
        if token.endswith(RUN_FOLDER_FILES):
            continue
        if parts[0] in APP_MODELS and len(parts) == 2 and parts[1][0].isupper():
            if not _defines(ROOT / APP_MODELS[parts[0]], parts[1]):
                missing.append(token)
            continue
        if parts[0] not in ("trainer", "lab", "dashboard", "integrations", "bench"):
            continue
        if _module_file(token):
            continue
        # the longest prefix that is a module; the next part must be a name it defines
        for cut in range(len(parts) - 1, 0, -1):
            module = _module_file(".".join(parts[:cut]))
            if module is not None:
                if not _defines(module, parts[cut]):
                    missing.append(token)
                break
        else:
            missing.append(token)
    assert missing == [], "docs/design.md names modules or names that do not exist"


PRODUCT_FOLDERS = ("trainer", "platform", "dashboard", "integrations")
MAX_PRODUCT_LINES = 500


def test_no_product_file_over_500_lines():
    """A file past 500 lines holds more than one job: split it along its seams
    (docs/design.md 1.3). Migrations are generated and exempt; so is the vendored
    plotly.js bundle."""
    long = []
    for folder in PRODUCT_FOLDERS:
        for path in (ROOT / folder).rglob("*"):
            if path.suffix not in (".py", ".js", ".html", ".css") or "migrations" in path.parts:
                continue
            if path.name.startswith("plotly"):
                continue
            n = len(path.read_text(errors="replace").splitlines())
            if n > MAX_PRODUCT_LINES:
                long.append(f"{path.relative_to(ROOT)}: {n} lines")
    assert long == []


def test_no_product_file_skips_the_formatter():
    """The line cap counts formatted code: a ``fmt: skip`` (or ``fmt: off``) that
    packs a statement onto one line would let a file past 500 lines hide under it."""
    marked = []
    for folder in PRODUCT_FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text(errors="replace")
            if "fmt: skip" in text or "fmt: off" in text:
                marked.append(str(path.relative_to(ROOT)))
    assert marked == []


def test_the_device_check_runs_every_gpu_test():
    """bench/device_check.py runs the gpu-marked tests by file (with --noconftest,
    so a GPU host needs only the trainer's dependencies): a gpu test in any other
    file would never run anywhere."""
    from bench.device_check import GPU_TESTS

    marked = sorted(
        str(path.relative_to(ROOT))
        for path in (ROOT / "tests").rglob("test_*.py")
        if re.search(r"pytest\.mark\.gpu\b", path.read_text())
    )
    assert marked == sorted(GPU_TESTS)
