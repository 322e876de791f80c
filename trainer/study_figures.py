"""PNG figures of a study (matplotlib, headless): the evidence behind the table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from trainer import metric_keys as K


def _mean_series(seeds: list[dict], key: str) -> tuple[list[int], list[float]]:
    by_step: dict[int, list[float]] = {}
    for seed in seeds:
        for step, value in seed["series"][key]:
            if value is not None:
                by_step.setdefault(step, []).append(value)
    steps = sorted(by_step)
    return steps, [sum(by_step[s]) / len(by_step[s]) for s in steps]


def _line_figure(results: dict[str, Any], key: str, ylabel: str, scale: float, path: Path):
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    for name, data in results["variants"].items():
        if not data["seeds"]:
            continue
        steps, values = _mean_series(data["seeds"], key)
        ax.plot(steps, [v * scale for v in values], label=name, linewidth=1.4)
    ax.set_xlabel("RL step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(f"{ylabel} (mean over seeds), study {results['study']}")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _collapse_figure(results: dict[str, Any], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    names = list(results["variants"])
    for i, name in enumerate(names):
        for seed in results["variants"][name]["seeds"]:
            summary = seed["summary"]
            if summary["collapsed"]:
                ax.plot(i, summary["collapse_step"], "o", color="tab:red")
            else:  # censored: survived to its last step (a lower bound), drawn as an open up-arrow
                ax.plot(i, summary["steps"], "^", mfc="none", color="tab:green")
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("collapse step (open triangle: never collapsed, censored)")
    ax.grid(alpha=0.3, axis="y")
    ax.set_title(f"Collapse step per seed, study {results['study']}")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def write_figures(results: dict[str, Any], out: Path) -> list[Path]:
    return [
        _line_figure(results, K.MISMATCH_KL_K3, "training-inference KL k3 (x1e-3)", 1e3,
                     out / "kl_k3.png"),
        _line_figure(results, K.MISMATCH_ROUTING_INCONSISTENCY, "routing inconsistency (%)",
                     100, out / "routing_inconsistency.png"),
        _line_figure(results, K.REWARD_ACCURACY, "batch accuracy", 1.0, out / "accuracy.png"),
        _collapse_figure(results, out / "collapse_steps.png"),
    ]  # fmt: skip
