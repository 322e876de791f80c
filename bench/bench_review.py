"""Server time of a whole stability review: the page and every chart it asks for.

A review is GET /stability/?experiment=N plus each chart endpoint the page names
(``data-url``: the collapse strip, the survival curves, the routing-gap scatter,
...), timed in process with Django's test client (middleware, session auth,
queries, statistics, figures, encoding; no network, no WSGI server). The browser
asks for the charts in parallel; on a 2-core machine the server runs them about
one after another, so the sum of the requests is the time a user waits for the
last chart (target: under 2 s at 12 runs). Rounds are paired and rotated
(bench.common.run_rounds), wall and thread CPU time, the load recorded.

Two synthetic studies (bench/review_study.py), 150 steps a run as the demo's:
"12 runs", four variants x three seeds (the demo's shape), and "8 variants",
eight variants, 17 runs.

    .venv/bin/python -m bench.bench_review [--rounds 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import statistics
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "platform")]

STEPS = 150


def review_urls(client, experiment_id: int) -> list[str]:
    """The page, then every chart URL it names."""
    page = f"/stability/?experiment={experiment_id}"
    html = client.get(page).content.decode()
    charts = [u.replace("&amp;", "&") for u in re.findall(r'data-url="([^"]+)"', html)]
    return [page, *charts]


def measure(client, experiment_id: int, rounds: int) -> dict:
    import time

    from bench.common import run_rounds

    # The first review of a fresh server process also imports what the statistics
    # and figures need (scipy, lifelines, pandas) unless the warm-up
    # (dashboard/web/warmup.py) loaded them while the user was on the page before.
    start = time.perf_counter()
    urls = review_urls(client, experiment_id)
    for url in urls[1:]:
        assert client.get(url).status_code == 200, url
    first = time.perf_counter() - start

    def review() -> None:
        for url in urls:
            response = client.get(url)
            assert response.status_code == 200, (url, response.status_code)

    calls = {url: functools.partial(client.get, url) for url in urls} | {"review": review}
    timed = run_rounds(calls, rounds, warmup=1)
    print(timed.load_line())
    return {
        "urls": {
            url: {
                "wall_ms": 1000 * statistics.median(timed.wall[url]),
                "cpu_ms": 1000 * statistics.median(timed.cpu[url]),
            }
            for url in urls
        },
        "first_review_wall_s": first,
        "review_wall_s": statistics.median(timed.wall["review"]),
        "review_cpu_s": statistics.median(timed.cpu["review"]),
        "timing": timed.record(),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--landing",
        action="store_true",
        help="open another page first and let its warm-up finish (else: the review is "
        "the process's first request, cold imports included)",
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "review.json"))
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="lab-bench-review-"))
    os.environ.update(
        {
            "LAB_VAR_DIR": str(tmp),
            "CELERY_BROKER_URL": "filesystem://",
            "DJANGO_SETTINGS_MODULE": "lab.site.settings",
            "DJANGO_SECRET_KEY": os.environ.get("DJANGO_SECRET_KEY", "bench"),
            "DATABASE_URL": f"sqlite:///{tmp / 'db.sqlite3'}",
            "OMP_NUM_THREADS": "1",
        }
    )
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client

    from bench.review_study import VARIANTS, make_study

    settings.ALLOWED_HOSTS = ["testserver"]
    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create_user("bench", password="pw")
    client = Client()
    client.force_login(user)
    if args.landing:
        from dashboard.web import warmup

        # A user lands on another page first (the login, the experiment page):
        # its request starts the warm-up; the review is opened once it is done.
        client.get("/experiments/")
        for thread in threading.enumerate():
            if thread.name == "review-warmup":
                thread.join()
        assert warmup._started.is_set()
    studies = {
        "12 runs": make_study(user, "12 runs", variants=VARIANTS[:4], seeds=3, steps=STEPS),
        "8 variants": make_study(user, "8 variants", steps=STEPS),
    }
    results = {}
    for name, study in studies.items():
        runs = sum(len(r) for r in study["runs"].values())
        results[name] = {
            "runs": runs,
            "steps": STEPS,
            **measure(client, study["experiment"].pk, args.rounds),
        }
        row = results[name]
        print(f"{name} ({runs} runs): first review {row['first_review_wall_s']:.2f} s, then "
              f"{row['review_wall_s']:.2f} s wall, {row['review_cpu_s']:.2f} s CPU")  # fmt: skip
        for url, t in row["urls"].items():
            print(f"  {url[:70]:70} {t['wall_ms']:8.1f} ms {t['cpu_ms']:8.1f} ms CPU")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
