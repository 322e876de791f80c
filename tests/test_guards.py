"""Guards for the two layout traps (docs/design.md section 1)."""

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
        "import sys, trainer, trainer.config, trainer.presets, trainer.metric_keys;"
        "import pkgutil, importlib;"
        "[importlib.import_module(m.name) for m in pkgutil.walk_packages(trainer.__path__, 'trainer.')"
        " if not m.name.endswith('__main__')];"
        "bad = [m for m in sys.modules if m == 'django' or m.startswith('django.')];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
