#!/usr/bin/env python
"""Django entry point. platform/ is a source folder, never a package: a package
named `platform` would shadow the standard library module that uuid, Celery and
kombu import, so its apps are put on sys.path and imported by their own names."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "platform"))
sys.path.insert(0, str(ROOT))


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "labsite.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
