"""TensorBoard event files of a run trained elsewhere (slime's and OpenRLHF's
``SummaryWriter``, verl's tensorboard logger, transformers' ``TensorBoardCallback``),
imported as an external lab run, read with TensorBoard's own reader
(``EventAccumulator``):

* scalars (scalar summaries and 0-d tensors): stored through the same path as
  MLflow's log-batch (tracking/services.py: every point kept as logged, the
  frameworks' names mapped onto the lab's keys, idempotent per point);
* histograms: an expert-load histogram (a tag naming experts and a layer, whose
  buckets each hold one integer: the experts' ids, one count per routed token)
  becomes that layer's ``experts/load/L{i}`` vector (the heatmaps); any other
  becomes a distribution, ``dist/<tag>``: its values at TensorBoard's
  distribution percentiles (trainer/metric_keys.py ``DISTRIBUTION_PERCENTS``),
  drawn as bands on the run page;
* everything else (text, images, audio, graphs, other plugins' tensors) is not
  a metric: one line per tag says so, with the reason, in the run's import
  notes (the run page and the import's answer list them).

slime logs on two step axes (tracking/metric_map.py ``SLIME_TRAIN_PREFIX``): its
train metrics at ``rollout x steps per rollout + step``, its rollout metrics at
the rollout id. The lab charts both at the rollout id, so a collapse is at one
step on every chart: train step s is charted at ``s // k``, k the steps per
rollout (given, or inferred from the two axes' lengths; kept on the run). The
points keep their own steps.

A folder still being written is followed: ``poll`` reloads the accumulator (which
reads on from where each file stopped) and stores what it has not stored yet.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from lab.runs.models import Run
from lab.tracking import metric_map, services
from lab.tracking.models import TrackedRun
from lab.tracking.payload import (
    MAX_METRIC_KEY_LENGTH,
    MAX_METRICS_PER_BATCH,
    MAX_STEP,
    NON_FINITE,
    Point,
)
from trainer import metric_keys as mk

CLIENT = "tensorboard-import"
# a tag naming experts and a layer: "moe/layer_3/expert_ids", "experts/L3", "expert_load/layers.3"
_EXPERT_TAG = re.compile(r"expert", re.IGNORECASE)
_LAYER = re.compile(r"(?:layers?|blocks?|\bL)[._/-]?(\d{1,4})(?!\d)", re.IGNORECASE)
MAX_EXPERTS = 4096


def _accumulator(folder: Path):
    from tensorboard.backend.event_processing.event_accumulator import (
        COMPRESSED_HISTOGRAMS,
        HISTOGRAMS,
        SCALARS,
        TENSORS,
        EventAccumulator,
    )

    # 0 = keep every event (the default keeps a reservoir sample per tag)
    guidance = {SCALARS: 0, TENSORS: 0, HISTOGRAMS: 0, COMPRESSED_HISTOGRAMS: 0}
    return EventAccumulator(str(folder), size_guidance=guidance)


def _plugin(acc, tag: str) -> str:
    try:
        return acc.SummaryMetadata(tag).plugin_data.plugin_name
    except (KeyError, AttributeError):
        return ""


def _scalar_events(acc) -> dict[str, list[tuple[int, float, float]]]:
    """{tag: [(step, wall_time_s, value)]} of every scalar, written as a scalar summary
    (torch's SummaryWriter) or as a 0-d numeric tensor (TF2's tf.summary.scalar)."""
    from tensorboard.util import tensor_util

    tags = acc.Tags()
    out: dict[str, list[tuple[int, float, float]]] = {}
    for tag in tags.get("scalars", []):
        out[tag] = [(e.step, e.wall_time, float(e.value)) for e in acc.Scalars(tag)]
    for tag in tags.get("tensors", []):
        if _plugin(acc, tag) not in ("", "scalars"):
            continue
        events = []
        for e in acc.Tensors(tag):
            array = tensor_util.make_ndarray(e.tensor_proto)
            if array.size == 1 and array.dtype.kind in "fiub":
                events.append((e.step, e.wall_time, float(array.reshape(-1)[0])))
        if events:
            out.setdefault(tag, []).extend(events)
    return out


def _not_imported(acc) -> list[dict[str, Any]]:
    """One note per tag that is not a metric: text, images, audio, graphs, other
    plugins' tensors (TensorBoard's kinds as ``Tags()`` lists them)."""
    tags = acc.Tags()
    notes = []
    reasons = {
        "images": "an image is not a metric",
        "audio": "audio is not a metric",
    }
    for kind, reason in reasons.items():
        notes += [{"tag": t, "kind": kind, "reason": reason} for t in tags.get(kind, [])]
    for tag in tags.get("tensors", []):
        plugin = _plugin(acc, tag)
        if plugin in ("", "scalars"):
            continue
        reason = {
            "text": "text is not a metric (a sample, a note): read it in TensorBoard",
            "histograms": "a histogram written as a tensor (TF2): import it from torch's SummaryWriter",
        }.get(plugin, f"the {plugin or 'unknown'} plugin's data is not a metric")
        # torch's add_text writes the tag as "<tag>/text_summary"
        name = tag.removesuffix("/text_summary") if plugin == "text" else tag
        notes.append({"tag": name, "kind": plugin or "tensor", "reason": reason})
    if tags.get("graph"):
        notes.append({"tag": "(graph)", "kind": "graph", "reason": "a model graph is not a metric"})
    return notes


def _buckets(histogram) -> list[tuple[float, float, float]]:
    """A histogram's (left, right, count) buckets; TensorBoard counts a value in the
    first bucket whose limit it does not exceed."""
    out, left = [], histogram.min
    for limit, count in zip(histogram.bucket_limit, histogram.bucket, strict=True):
        right = min(limit, histogram.max)
        out.append((left, right, count))
        left = limit
    return out


def expert_counts(histogram) -> list[float] | None:
    """Tokens per expert from a histogram of routed experts' ids, when every bucket
    with a count holds exactly one integer (an id >= 0); else None."""
    if histogram.num <= 0 or histogram.min < 0 or histogram.max >= MAX_EXPERTS:
        return None
    counts: dict[int, float] = {}
    for i, (left, right, count) in enumerate(_buckets(histogram)):
        if count <= 0:
            continue
        first = math.ceil(left) if i == 0 else math.floor(left) + 1
        ids = list(range(first, math.floor(right) + 1))
        if len(ids) != 1:
            return None
        counts[ids[0]] = counts.get(ids[0], 0.0) + count
    if not counts:
        return None
    return [counts.get(e, 0.0) for e in range(max(counts) + 1)]


def expert_layer(tag: str) -> int | None:
    """The layer an expert histogram's tag names, else None (not an expert histogram)."""
    if not _EXPERT_TAG.search(tag):
        return None
    match = _LAYER.search(tag)
    return int(match.group(1)) if match else None


def slime_steps_per_rollout(scalars: dict[str, list[tuple[int, float, float]]]) -> tuple[int, bool]:
    """(k, whether slime's rollout axis is in train steps too) inferred from the two
    axes: the train axis has k steps per rollout (--wandb-always-use-train-step puts
    the rollout metrics at multiples of k instead)."""
    train = {
        e[0] for t, ev in scalars.items() if t.startswith(metric_map.SLIME_TRAIN_PREFIX) for e in ev
    }
    rollout = {
        e[0]
        for t, ev in scalars.items()
        if not t.startswith(metric_map.SLIME_TRAIN_PREFIX)
        for e in ev
    }
    if not train or not rollout:
        return 1, False
    k = max(1, round((max(train) + 1) / (max(rollout) + 1)))
    if k == 1 and len(rollout) > 1:
        gaps = {b - a for a, b in zip(sorted(rollout), sorted(rollout)[1:], strict=False)}
        if len(gaps) == 1 and (gap := gaps.pop()) > 1:
            return gap, True  # rollouts at multiples of k on the train axis
    return k, False


class TensorBoardImport:
    """One event folder into one external run; ``poll`` stores what is new."""

    def __init__(self, run: Run, folder: Path, steps_per_rollout: int | None = None):
        self.run = run
        self.folder = folder
        self.acc = _accumulator(folder)
        self.seen: dict[tuple[str, str], int] = {}  # (kind, tag) -> events already stored
        self.given_k = steps_per_rollout
        self.skipped = 0  # scalar events not stored: a step outside 0..MAX_STEP, a tag too long

    @classmethod
    def start(
        cls,
        *,
        user,
        experiment_id: int,
        folder: Path,
        run_name: str = "",
        framework: str = "",
        steps_per_rollout: int | None = None,
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
        return cls(run, folder, steps_per_rollout)

    @classmethod
    def resume(
        cls, run_id: int, folder: Path, steps_per_rollout: int | None = None
    ) -> TensorBoardImport:
        """Read ``folder`` again into an existing external run (an import repeated, or a
        follow restarted): points already stored are written again unchanged."""
        run, _ = services.get_run(run_id)
        return cls(run, folder, steps_per_rollout)

    def _framework(self, tags: list[str]) -> str:
        self.run.refresh_from_db(fields=["source"])
        return self.run.source.get("framework") or metric_map.detect_framework(tags)

    def _lab_step(self, user, framework: str, scalars) -> Any:
        """slime: the train axis onto the rollout axis (module docstring); when the steps
        per rollout change, the train metrics stored before are stored again."""
        if framework != metric_map.SLIME:
            return None
        k, both = slime_steps_per_rollout(scalars)
        k = self.given_k or k
        before = self.run.source.get(metric_map.STEPS_PER_ROLLOUT)
        if before != [k, both]:
            services.set_source(
                user=user, run_id=self.run.pk, **{metric_map.STEPS_PER_ROLLOUT: [k, both]}
            )
            self.run.refresh_from_db(fields=["source"])
            if before is not None:  # realign what is stored: forget the train keys, read again
                train = [t for t in scalars if t.startswith(metric_map.SLIME_TRAIN_PREFIX)]
                services.forget_metrics(user=user, run_id=self.run.pk, names=train)
                for tag in train:
                    self.seen.pop(("scalar", tag), None)
        return metric_map.lab_step_function(framework, self.run.source)

    def poll(self, user) -> int:
        """Reload the event files and store the new points; returns how many."""
        self.acc.Reload()
        scalars = _scalar_events(self.acc)
        framework = self._framework(list(scalars))
        lab_step = self._lab_step(user, framework, scalars)
        points: list[Point] = []
        for tag, events in scalars.items():
            start = self.seen.get(("scalar", tag), 0)
            for step, wall_time, value in events[start:]:
                if 0 <= step <= MAX_STEP and len(tag) <= 200:
                    points.append(_point(tag, value, wall_time, step))
                else:
                    self.skipped += 1
            self.seen[("scalar", tag)] = len(events)
        for i in range(0, len(points), MAX_METRICS_PER_BATCH):
            services.log_batch(
                user=user,
                run_id=self.run.pk,
                metrics=points[i : i + MAX_METRICS_PER_BATCH],
                lab_step=lab_step,
            )
        vectors = self._histograms(lab_step)
        if vectors:
            services.log_vectors(user=user, run_id=self.run.pk, by_step=vectors)
        services.set_import_notes(user=user, run_id=self.run.pk, notes=_not_imported(self.acc))
        return len(points) + sum(len(v) for v in vectors.values())

    def _histograms(self, lab_step) -> dict[int, dict[str, list]]:
        """{lab step: {key: vector}} of the histograms not stored yet."""
        out: dict[int, dict[str, list]] = {}
        for tag in self.acc.Tags().get("histograms", []):
            events = self.acc.Histograms(tag)
            start = self.seen.get(("histogram", tag), 0)
            self.seen[("histogram", tag)] = len(events)
            layer = expert_layer(tag)
            compressed = None
            for n, event in enumerate(events[start:], start):
                step = event.step if lab_step is None else lab_step(tag, event.step)
                if not 0 <= step <= MAX_STEP:
                    continue
                counts = expert_counts(event.histogram_value) if layer is not None else None
                if counts is not None:
                    total = sum(counts)
                    out.setdefault(step, {})[mk.experts_load(layer)] = [c / total for c in counts]
                    continue
                if compressed is None:
                    compressed = self.acc.CompressedHistograms(tag)
                values = [value for _, value in compressed[n].compressed_histogram_values]
                key = f"{mk.DISTRIBUTION_PREFIX}{tag}"[:MAX_METRIC_KEY_LENGTH]
                out.setdefault(step, {})[key] = [v if math.isfinite(v) else None for v in values]
        return out

    def finish(self, user, status: str = "FINISHED") -> Run:
        run, _ = services.update_run(user=user, run_id=self.run.pk, status=status)
        return run

    @property
    def tracked(self) -> TrackedRun:
        return TrackedRun.objects.get(run_id=self.run.pk)


def _point(tag: str, value: float, wall_time: float, step: int) -> Point:
    if math.isfinite(value):
        return Point(tag, value, int(wall_time * 1000), int(step))
    special = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return Point(tag, None, int(wall_time * 1000), int(step), NON_FINITE[special])
