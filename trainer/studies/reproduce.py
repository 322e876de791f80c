"""Rerun one recorded run and compare it with its record, value for value.

A reviewer's check of a committed study (docs/results.md): the run folder's
``config.json`` is trained again into a fresh folder, its base warm-started again
unless the warm-start cache holds it, for its first ``steps`` steps (``stop_after``:
the schedule is the recorded run's, so the first steps are the same steps) or all
of them, and every number those steps logged is compared with the record exactly.
On the same CPU model, torch build and thread count the lab's runs are
deterministic, so the answer is "identical" or the first value that is not.
Readings of the clock and the machine's load (``time/``, ``throughput/``) differ
by nature and are left out.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.devices.environment import code_record, environment_record
from trainer.errors import FieldError
from trainer.run_folder.files import CONFIG_FILE, SUMMARY_FILE, read_metrics
from trainer.validation import validate_config

# Keys whose values are clock or load readings, never the run's own numbers.
UNCOMPARED_PREFIXES = ("time/", "throughput/")
# Machine facts that must agree for the bits to be expected to agree.
ENVIRONMENT_FACTS = (
    ("cpu", "model_name"),
    ("cpu", "family"),
    ("cpu", "model"),
    ("cpu", "capability"),
    ("torch",),
    ("blas", "library"),
)


@dataclass
class Comparison:
    """What a rerun reproduced: ``steps`` compared, ``values`` equal among them,
    ``differences`` as (step, key, recorded, rerun), ``machine`` the environment
    facts and code that differ from the record's (empty: the same machine kind and
    the same trainer source)."""

    steps: int
    values: int
    differences: list[tuple[int, str, Any, Any]] = field(default_factory=list)
    machine: list[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return self.steps > 0 and not self.differences


def _same(a: Any, b: Any) -> bool:
    """Exact equality; NaN equals NaN (a recorded NaN is reproduced by a NaN)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def compare_rows(recorded: list[dict], rerun: list[dict]) -> Comparison:
    """Compare the rerun's rows with the recorded rows of the same steps, key by key
    (a key one side lacks is a difference too)."""
    by_step = {row["step"]: row for row in recorded}
    comparison = Comparison(steps=0, values=0)
    for row in rerun:
        old = by_step.get(row["step"])
        if old is None:
            comparison.differences.append((row["step"], "step", None, row["step"]))
            continue
        comparison.steps += 1
        for key in sorted(set(old) | set(row)):
            if key.startswith(UNCOMPARED_PREFIXES):
                continue
            if _same(old.get(key), row.get(key)):
                comparison.values += 1
            else:
                comparison.differences.append((row["step"], key, old.get(key), row.get(key)))
    return comparison


def machine_differences(recorded: dict | None, here: dict) -> list[str]:
    """The environment facts (``ENVIRONMENT_FACTS``) on which this machine differs."""
    out = []
    for path in ENVIRONMENT_FACTS:
        old, new = recorded or {}, here
        for part in path:
            old = old.get(part) if isinstance(old, dict) else None
            new = new.get(part) if isinstance(new, dict) else None
        if old != new:
            out.append(f"{'.'.join(path)}: recorded {old!r}, here {new!r}")
    return out


def code_differences(recorded: dict | None, here: dict) -> list[str]:
    """Whether this checkout's trainer is the code the run ran with (its source hash);
    the bits are expected only with that code."""
    code = (recorded or {}).get("code")
    if not code:
        return ["code: not recorded (the run predates code records); its commit is in git log"]
    if code.get("sha256") == here.get("sha256"):
        return []
    return [
        f"code: recorded commit {code.get('commit') or '?'}"
        f"{' with local changes' if code.get('modified') else ''}, here {here.get('commit') or '?'}"
        f"{' with local changes' if here.get('modified') else ''}: check out the recorded commit"
    ]


def reproduce(run_dir: Path, out: Path, steps: int | None = None) -> Comparison:
    """Train ``run_dir``'s config again into ``out`` (empty or new) for ``steps`` steps
    (default: all the record has) and compare (module docstring)."""
    from trainer.run.runner import train

    run_dir, out = Path(run_dir), Path(out)
    if not (run_dir / CONFIG_FILE).is_file():
        raise FieldError([("run_dir", f"no {CONFIG_FILE} in {run_dir}: not a run folder")])
    recorded = read_metrics(run_dir)
    if not recorded:
        raise FieldError([("run_dir", f"{run_dir} has no metrics to compare with")])
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FieldError([("--out", f"{out} is not an empty folder: give a new one")])
    if out.resolve() == run_dir.resolve():
        raise FieldError([("--out", "give a folder other than the recorded run's")])
    if steps is not None and steps < 1:
        raise FieldError([("--steps", "give at least 1")])
    cfg = validate_config(json.loads((run_dir / CONFIG_FILE).read_text()))
    summary_file = run_dir / SUMMARY_FILE
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
    recorded_env = summary.get("environment")
    machine = machine_differences(recorded_env, environment_record())
    machine += code_differences(recorded_env, code_record())
    upto = min(steps or len(recorded), len(recorded))
    train(cfg, out, stop_after=upto if upto < cfg.run.steps else None, log=lambda *_: None)
    comparison = compare_rows(recorded, read_metrics(out)[:upto])
    comparison.machine = machine
    return comparison


def describe(comparison: Comparison, limit: int = 10) -> str:
    """The comparison in a few lines for the terminal."""
    lines = []
    if comparison.machine:
        lines.append(
            "this machine or code differs from the record's (bits are expected only on the same):"
        )
        lines += [f"  {line}" for line in comparison.machine]
    if comparison.identical:
        lines.append(
            f"identical: {comparison.steps} steps, {comparison.values} values equal to the bit"
        )
        return "\n".join(lines)
    lines.append(
        f"different: {len(comparison.differences)} values differ over {comparison.steps} steps "
        f"({comparison.values} equal); the first {min(limit, len(comparison.differences))}:"
    )
    for step, key, old, new in comparison.differences[:limit]:
        lines.append(f"  step {step} {key}: recorded {old!r}, rerun {new!r}")
    return "\n".join(lines)
