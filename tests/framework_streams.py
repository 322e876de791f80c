"""Metric streams of verl, slime and OpenRLHF runs under the names they really log.

The names, where each framework logs it and on which step axis, were read from
the frameworks' source and recorded in tests/fixtures/frameworks/*.json (one file
per framework version). ``stream`` makes a run of such names with a collapse
planted at one RL step: the reward and the entropy fall there, the framework's
mismatch signal rises five steps before; every other name holds a steady value.
``write_tensorboard`` writes it as the framework's SummaryWriter does,
``mlflow_batches`` as its MLflow logger sends it. A plain module on the test path.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent / "fixtures" / "frameworks"
T0_S = 1_700_000_000.0  # wall time of step 0, seconds
STEP_S = 30.0  # seconds per RL step


def fixtures() -> dict[str, dict[str, Any]]:
    """{file stem: fixture} of every recorded framework version."""
    return {p.stem: json.loads(p.read_text()) for p in sorted(FIXTURES.glob("*.json"))}


def _value(name: str, signals: dict[str, str], step: int, collapse_at: int) -> float:
    wobble = 0.01 * ((step * 7) % 3 - 1)
    if name == signals["reward"]:
        return (0.72 if step < collapse_at else 0.04) + wobble
    if name == signals["entropy"]:
        return (0.9 if step < collapse_at else 0.15) + wobble
    if name == signals["mismatch"]:
        return 0.002 if step < collapse_at - 5 else 0.05
    return 1.0 + 0.001 * (len(name) % 7)


def stream(
    fixture: dict[str, Any], steps: int, collapse_at: int
) -> list[tuple[str, int, float, float]]:
    """(name, step as the framework logs it, wall time s, value) of every point: one per
    name and RL step, or, for slime's train names, one per train step (steps_per_rollout
    a rollout, at rollout x k + i)."""
    k = int(fixture.get("steps_per_rollout", 1))
    train_axis = fixture["framework"] == "slime"
    out = []
    for step in range(steps):
        for name in fixture["names"]:
            value = _value(name, fixture["signals"], step, collapse_at)
            if train_axis and name.startswith("train/"):
                for i in range(k):
                    out.append((name, step * k + i, T0_S + step * STEP_S + i, value))
            else:
                out.append((name, step, T0_S + step * STEP_S, value))
    return out


def write_tensorboard(folder: Path, fixture: dict[str, Any], steps: int, collapse_at: int) -> None:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(folder))
    for name, step, wall, value in stream(fixture, steps, collapse_at):
        writer.add_scalar(name, value, step, walltime=wall)
    for name in fixture.get("text", {}):
        writer.add_text(name, "Sample: 1+1=\\n2\\n\\nReward: 1.0", 0)
    writer.close()


def mlflow_batches(
    fixture: dict[str, Any], steps: int, collapse_at: int, size: int = 1000
) -> list[list[dict]]:
    """The stream as MLflow log-batch ``metrics`` lists (timestamps in ms)."""
    points = [
        {"key": name, "value": value, "timestamp": int(wall * 1000), "step": step}
        for name, step, wall, value in stream(fixture, steps, collapse_at)
    ]
    return [points[i : i + size] for i in range(0, len(points), size)]
