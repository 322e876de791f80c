"""The demo `make up` queues the first time: a slice of the causal study, in
the background of the queue.

DEMO_VARIANTS of the causal study (trainer/studies/causal.json) x DEMO_SEEDS:
the cells that decide its question (does a routing-only gap make MoE
collapse? does R3 prevent it? do the zero-gap MoE and dense controls learn?),
three seeds of base 0 (seeds 0, 4, 8 of the study: the same runs as the
study's own, so the demo reproduces its documented steps), queued seed-major
so the first four finished runs already compare every cell. 12 runs of 150
steps: docs/platform.md has the wall times.

The demo queues at ``LOWEST_PRIORITY``: a run a user submits with the default
priority starts on the next free slot, before every demo run still waiting.
Its sweep can be paused, resumed or cleared (``lab.runs.bulk``) without
touching its finished runs.
"""

from __future__ import annotations

from lab.experiments.models import Experiment, Sweep
from lab.experiments.services import create_experiment
from lab.runs.lifecycle import LOWEST_PRIORITY
from lab.runs.sweeps import create_study_sweep
from trainer.studies.definition import builtin_dict

STUDY = "causal"
DEMO_VARIANTS = ("moe-s0", "moe-s0.2", "moe-r3-s0.2", "dense")
DEMO_SEEDS = [0, 4, 8]
DEMO_PRIORITY = LOWEST_PRIORITY
DEMO_USER = "demo"
DEMO_EXPERIMENT = "Demo: MoE collapse against a routing-only gap, R3 and dense"
# Where the study stands (docs/results.md), so the demo's reader knows what to look
# for; the demo's own runs say what they say.
DEMO_FINDING = (
    "The causal study (docs/results.md) is pre-registered: routing-only gaps from "
    "rollout.router_noise on fp32 rollouts, 12 runs per cell over 4 bases; its results "
    "and decision are reported there. "
)


def demo_definition() -> dict:
    """The causal study cut down to DEMO_VARIANTS x DEMO_SEEDS, each run on one thread."""
    definition = builtin_dict(STUDY)
    definition["variants"] = [v for v in definition["variants"] if v["name"] in DEMO_VARIANTS]
    definition["seeds"] = list(DEMO_SEEDS)
    definition["description"] = (
        f"The demo: {len(DEMO_VARIANTS)} cells of the causal study x "
        f"{len(DEMO_SEEDS)} seeds, one thread per run, at the lowest priority (your runs "
        f"start first). {DEMO_FINDING}" + definition["description"]
    )
    return definition


def demo_experiment() -> Experiment | None:
    """The demo's experiment, if `make up` queued it (its demo user owns it)."""
    return (
        Experiment.objects.filter(name=DEMO_EXPERIMENT, owner__username=DEMO_USER)
        .order_by("pk")
        .first()
    )


def demo_sweeps():
    """The demo's sweep(s): a queryset, empty before `make up` queued it."""
    return Sweep.objects.filter(experiment=demo_experiment()).order_by("pk")


def queue_demo(owner, *, queue: str, steps: int | None = None) -> Sweep | None:
    """Queue the demo once (None when it was queued before): every run on one
    thread, at DEMO_PRIORITY; ``steps`` shortens each run."""
    if demo_experiment() is not None:
        return None
    definition = demo_definition()
    experiment = create_experiment(
        owner=owner,
        name=DEMO_EXPERIMENT,
        description=definition.get("description", ""),
        tags=["study", "demo"],
    )
    return create_study_sweep(
        owner=owner,
        experiment=experiment,
        definition=definition,
        queue=queue,
        overrides=["run.threads=1", *([f"run.steps={steps}"] if steps else [])],
        priority=DEMO_PRIORITY,
    )
