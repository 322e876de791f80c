"""Start of the web process: wall time and peak RSS of a fresh interpreter that
loads the WSGI application and resolves every URL (importing every view module,
as the first request does), and whether torch got loaded.

    /usr/bin/time -v .venv/bin/python -m bench.bench_web_start

prints ``start_s=... torch=...``; /usr/bin/time adds the peak RSS ("Maximum
resident set size"). docs/benchmarks.md ("Web process start") has the numbers.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    started = time.perf_counter()
    sys.path[:0] = [str(ROOT), str(ROOT / "platform")]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lab.site.settings")
    from django.urls import get_resolver

    from lab.site.wsgi import application  # noqa: F401

    get_resolver().url_patterns  # noqa: B018 - imports every view module
    print(f"start_s={time.perf_counter() - started:.2f} torch={'torch' in sys.modules}")


if __name__ == "__main__":
    main()
