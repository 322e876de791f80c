"""A short side-by-side run of dense, MoE and MoE+R3 GRPO with a printed table.

It shows the product's point in about a minute of CPU: the MoE model's
training-inference KL and routing inconsistency next to the dense model's, and
what Rollout Routing Replay does to them.
"""

from __future__ import annotations

from pathlib import Path

from trainer import metric_keys as K
from trainer.config import apply_overrides
from trainer.config.presets import preset_dict
from trainer.run.runner import train
from trainer.run_folder.files import read_metrics
from trainer.validation import validate_config

DEMO_VARIANTS = ("dense-grpo", "moe-grpo", "moe-grpo-r3")


def _mean(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return sum(values) / len(values) if values else None


def _fmt(value: float | None, scale: float = 1.0, digits: int = 2) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def comparison_table(results: dict[str, tuple[dict, list[dict]]]) -> str:
    """Plain-text table: one row per variant (summary, metrics rows)."""
    header = (
        f"{'variant':<14}{'KL k3 x1e-3':>12}{'routing %':>11}{'extreme %':>11}"
        f"{'acc start':>11}{'acc end':>9}{'collapse':>10}{'step s':>8}"
    )
    lines = [header, "-" * len(header)]
    for name, (summary, rows) in results.items():
        collapse = (
            str(summary["collapse_step"]) if summary["collapsed"] else f">={summary['steps']}"
        )
        lines.append(
            f"{name:<14}"
            f"{_fmt(_mean(rows, K.MISMATCH_KL_K3), 1e3, 3):>12}"
            f"{_fmt(_mean(rows, K.MISMATCH_ROUTING_INCONSISTENCY), 100):>11}"
            f"{_fmt(_mean(rows, K.MISMATCH_EXTREME_TOKEN_FRAC), 100):>11}"
            f"{_fmt(summary['initial_accuracy']):>11}"
            f"{_fmt(summary['final_accuracy']):>9}"
            f"{collapse:>10}"
            f"{_fmt(_mean(rows, K.TIME_STEP_S)):>8}"
        )
    return "\n".join(lines)


def run_demo(out: Path, steps: int = 20, seed: int = 0) -> int:
    results = {}
    for name in DEMO_VARIANTS:
        print(f"== {name}: {steps} steps", flush=True)
        data = apply_overrides(
            preset_dict(name), [f"run.steps={steps}", f"run.seed={seed}", "run.eval_every=10"]
        )
        cfg = validate_config(data)
        summary = train(cfg, out / name)
        results[name] = (summary, read_metrics(out / name))
    print()
    print(comparison_table(results))
    print(f"\nrun folders: {out}/<variant>/metrics.jsonl, summary.json")
    return 0
