"""WSGI entry point (gunicorn labsite.wsgi with platform/ on PYTHONPATH)."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
for path in (str(ROOT), str(ROOT / "platform")):
    if path not in sys.path:
        sys.path.insert(0, path)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "labsite.settings")

from django.core.wsgi import get_wsgi_application  # noqa: E402

application = get_wsgi_application()
