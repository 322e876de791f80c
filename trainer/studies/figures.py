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


def _survival_figure(results: dict[str, Any], path: Path) -> Path:
    """Kaplan-Meier curves per variant: step functions, + marks at censored runs."""
    stats = results["statistics"]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    for name, v in stats["variants"].items():
        xs, ys, survival = [0], [1.0], 1.0
        for time, surv, _, _ in v["km"]:
            xs += [time, time]
            ys += [survival, surv]
            survival = surv
        xs.append(v["last_step"])
        ys.append(survival)
        (line,) = ax.plot(xs, ys, label=f"{name} ({v['collapsed']}/{v['runs']})", lw=1.4)
        censored = [
            s["summary"]["steps"]
            for s in results["variants"][name]["seeds"]
            if not s["summary"]["collapsed"]
        ]
        ax.plot(censored, [survival] * len(censored), "+", color=line.get_color(), ms=9)
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("RL step")
    ax.set_ylabel("share of seeds not collapsed (Kaplan-Meier)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, ncol=2)
    ax.set_title(f"Survival, study {results['study']} (+: censored run)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _dose_figure(results: dict[str, Any], path: Path) -> Path:
    """Collapse share and mean k3 (95% bootstrap CI) against the dose, one line per arm."""
    dose = results["statistics"]["dose"]
    levels = dose["levels"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6.5), dpi=110, sharex=True)
    for arm, cells in dose["arms"].items():
        xs = [i for i, c in enumerate(cells) if c]
        top.plot(xs, [cells[i]["collapsed"] / cells[i]["runs"] for i in xs], "o-", label=arm)
        ks = [i for i in xs if cells[i]["kl_k3_ci"]]
        mean = [max(cells[i]["kl_k3_ci"][0], 1e-12) for i in ks]
        low = [max(m - cells[i]["kl_k3_ci"][1], 0.0) for m, i in zip(mean, ks, strict=True)]
        high = [max(cells[i]["kl_k3_ci"][2] - m, 0.0) for m, i in zip(mean, ks, strict=True)]
        bottom.errorbar(ks, mean, yerr=[low, high], fmt="o-", capsize=3, label=arm)
    top.set_ylabel("collapsed / seeds")
    top.set_ylim(-0.05, 1.05)
    top.grid(alpha=0.3)
    top.legend(fontsize=8)
    top.set_title(f"Dose-response: {dose['axis']}, study {results['study']}")
    bottom.set_yscale("log")
    bottom.set_ylabel("mean per-step k3 (95% CI)")
    bottom.set_xticks(range(len(levels)), levels)
    bottom.set_xlabel(dose["axis"])
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _collapse_windows_figure(results: dict[str, Any], path: Path, limit: int = 12) -> Path | None:
    """Every detected collapse, by eye: reward, k3, entropy and grad norm around its step."""
    runs = [
        (name, seed)
        for name, data in results["variants"].items()
        for seed in data["seeds"]
        if seed["summary"]["collapsed"]
    ][:limit]
    if not runs:
        return None
    keys = [
        (K.REWARD_ACCURACY, "batch acc"),
        (K.MISMATCH_KL_K3, "k3 (log)"),
        (K.POLICY_ENTROPY, "entropy"),
        (K.POLICY_GRAD_NORM, "grad norm"),
    ]
    fig, axes = plt.subplots(len(runs), 4, figsize=(13, 1.9 * len(runs)), dpi=90, squeeze=False)
    for row, (name, seed) in enumerate(runs):
        step = seed["summary"]["collapse_step"]
        for col, (key, label) in enumerate(keys):
            ax = axes[row][col]
            points = [(s, v) for s, v in seed["series"].get(key, []) if v is not None]
            ax.plot([s for s, _ in points], [v for _, v in points], lw=0.8)
            if key == K.REWARD_ACCURACY and seed["series"].get(K.EVAL_ACCURACY):
                ev = [(s, v) for s, v in seed["series"][K.EVAL_ACCURACY] if v is not None]
                ax.plot([s for s, _ in ev], [v for _, v in ev], "o-", ms=3, color="black")
            if key == K.MISMATCH_KL_K3:
                ax.set_yscale("log")
            ax.axvline(step, color="tab:red", lw=1)
            ax.tick_params(labelsize=6)
            if row == 0:
                ax.set_title(label, fontsize=8)
        axes[row][0].set_ylabel(f"{name}\ns{seed['seed']} @{step}", fontsize=6)
    fig.suptitle("Detected collapses (red line; black dots: held-out accuracy)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def write_figures(results: dict[str, Any], out: Path) -> list[Path]:
    extra = []
    if results.get("statistics"):
        extra.append(_survival_figure(results, out / "survival.png"))
        if results["statistics"].get("dose"):
            extra.append(_dose_figure(results, out / "dose_response.png"))
        windows = _collapse_windows_figure(results, out / "collapse_windows.png")
        if windows is not None:
            extra.append(windows)
    return [
        *extra,
        _line_figure(
            results, K.MISMATCH_KL_K3, "training-inference KL k3 (x1e-3)", 1e3, out / "kl_k3.png"
        ),
        _line_figure(
            results,
            K.MISMATCH_ROUTING_INCONSISTENCY,
            "routing inconsistency (%)",
            100,
            out / "routing_inconsistency.png",
        ),
        _line_figure(results, K.REWARD_ACCURACY, "batch accuracy", 1.0, out / "accuracy.png"),
        _collapse_figure(results, out / "collapse_steps.png"),
    ]
