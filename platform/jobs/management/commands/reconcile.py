"""Requeue runs whose worker stopped heartbeating (once, or every N seconds)."""

from __future__ import annotations

import time

from django.conf import settings
from django.core.management.base import BaseCommand

from jobs.services import reconcile_stale_runs


class Command(BaseCommand):
    help = "Requeue running runs with a stale heartbeat; fail those out of attempts."

    def add_arguments(self, parser):
        parser.add_argument("--stale-after", type=float, default=None, help="seconds")
        parser.add_argument("--every", type=float, default=0, help="loop with this period")

    def handle(self, *args, stale_after=None, every=0, **options):
        stale = stale_after if stale_after is not None else settings.LAB_STALE_AFTER_S
        while True:
            for action in reconcile_stale_runs(stale):
                self.stdout.write(
                    f"run {action.run_id}: {action.action} (attempt {action.attempts})"
                )
            if not every:
                return
            time.sleep(every)
