"""Start of the web process: wall time and peak RSS of a fresh interpreter that
loads the WSGI application and resolves every URL (importing every view module,
as the first request does), and whether torch got loaded.

    /usr/bin/time -v .venv/bin/python -m bench.bench_web_start

prints ``start_s=... cpu_s=... load=... torch=...`` (wall and CPU seconds of the
start, the 1-minute load average: on a loaded machine compare CPU seconds);
/usr/bin/time adds the peak RSS ("Maximum resident set size"). docs/benchmarks.md ("Web process start") has the numbers.
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
    # CPU: the whole interpreter's so far (it starts with this process), beside wall
    # time, which a loaded machine stretches.
    print(
        f"start_s={time.perf_counter() - started:.2f} cpu_s={time.process_time():.2f} "
        f"load={os.getloadavg()[0]:.2f} torch={'torch' in sys.modules}"
    )


if __name__ == "__main__":
    main()
