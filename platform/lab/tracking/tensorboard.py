"""TensorBoard event files of a run trained elsewhere (slime's and OpenRLHF's
``SummaryWriter``, transformers' ``TensorBoardCallback``), imported as an external
lab run: read with TensorBoard's own reader (``EventAccumulator``), the scalars
stored through the same path as MLflow's log-batch (tracking/services.py:
the frameworks' names mapped onto the lab's keys, idempotent per (run, key,
step)).

A folder still being written is followed: ``TensorBoardImport.poll`` reloads
the accumulator (which reads on from where each file stopped) and stores only
the points it has not stored yet; ``manage.py import_tensorboard --follow``
polls until the folder has been quiet for ``--idle-s`` seconds, then marks the
run finished.
"""

from __future__ import annotations

from pathlib import Path

from lab.runs.models import Run
from lab.tracking import services
from lab.tracking.models import TrackedRun
from lab.tracking.payload import MAX_METRICS_PER_BATCH, MAX_STEP, Point

CLIENT = "tensorboard-import"


def _accumulator(folder: Path):
    from tensorboard.backend.event_processing.event_accumulator import (
        SCALARS,
        TENSORS,
        EventAccumulator,
    )

    # 0 = keep every event (the default keeps a reservoir sample of 10,000 per tag)
    return EventAccumulator(str(folder), size_guidance={SCALARS: 0, TENSORS: 0})


def _scalar_events(acc) -> dict[str, list[tuple[int, float, float]]]:
    """{tag: [(step, wall_time_s, value)]} of every scalar, written as a scalar summary
    (torch's SummaryWriter) or as a 0-d tensor (TF2's tf.summary.scalar)."""
    from tensorboard.util import tensor_util

    tags = acc.Tags()
    out: dict[str, list[tuple[int, float, float]]] = {}
    for tag in tags.get("scalars", []):
        out[tag] = [(e.step, e.wall_time, float(e.value)) for e in acc.Scalars(tag)]
    for tag in tags.get("tensors", []):
        events = []
        for e in acc.Tensors(tag):
            array = tensor_util.make_ndarray(e.tensor_proto)
            if array.size == 1 and array.dtype.kind in "fiub":
                events.append((e.step, e.wall_time, float(array.reshape(-1)[0])))
        if events:
            out.setdefault(tag, []).extend(events)
    return out


class TensorBoardImport:
    """One event folder into one external run; ``poll`` stores what is new."""

    def __init__(self, run: Run, folder: Path):
        self.run = run
        self.folder = folder
        self.acc = _accumulator(folder)
        self.seen: dict[str, int] = {}  # tag -> events already stored

    @classmethod
    def start(
        cls, *, user, experiment_id: int, folder: Path, run_name: str = "", framework: str = ""
    ) -> TensorBoardImport:
        tags = [("mlflow.source.name", str(folder))]
        if framework:
            tags.append((services.FRAMEWORK_TAG, framework))
        run, _ = services.create_run(
            user=user,
            experiment_id=experiment_id,
            run_name=run_name or folder.name,
            tags=tags,
            client=CLIENT,
            remote_host="",
        )
        return cls(run, folder)

    @classmethod
    def resume(cls, run_id: int, folder: Path) -> TensorBoardImport:
        """Read ``folder`` again into an existing external run (an import repeated, or a
        follow restarted): points already stored are written again unchanged."""
        run, _ = services.get_run(run_id)
        return cls(run, folder)

    def poll(self, user) -> int:
        """Reload the event files and store the new points; returns how many."""
        self.acc.Reload()
        points: list[Point] = []
        for tag, events in _scalar_events(self.acc).items():
            start = self.seen.get(tag, 0)
            for step, wall_time, value in events[start:]:
                if 0 <= step <= MAX_STEP and len(tag) <= 200:
                    points.append(Point(tag, value, int(wall_time * 1000), int(step)))
            self.seen[tag] = len(events)
        for i in range(0, len(points), MAX_METRICS_PER_BATCH):
            services.log_batch(
                user=user, run_id=self.run.pk, metrics=points[i : i + MAX_METRICS_PER_BATCH]
            )
        return len(points)

    def finish(self, user, status: str = "FINISHED") -> Run:
        run, _ = services.update_run(user=user, run_id=self.run.pk, status=status)
        return run

    @property
    def tracked(self) -> TrackedRun:
        return TrackedRun.objects.get(run_id=self.run.pk)
