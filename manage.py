#!/usr/bin/env python
"""Django entry point. The Django project is the package ``lab`` in the source
folder platform/ (never a package itself: a package named ``platform`` would
shadow the standard library module that uuid, Celery and kombu import).
``pip install -e .`` makes ``lab`` importable; the two path entries below let a
checkout that is not installed (a git worktree, a container) run it too."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "platform"))
sys.path.insert(0, str(ROOT))


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lab.site.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
