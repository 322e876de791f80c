"""Sweeps: a grid x seeds, or a stability study, queued as one run per combination.

Every combination is validated before anything is stored, so a bad value
stores nothing; each create is one transaction.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from django.db import IntegrityError, transaction

from lab.configs import check_reward_function, resolve_config, strip_config_path
from lab.experiments.models import Experiment, Sweep
from lab.experiments.rights import check_can_queue, check_priority_allowed
from lab.runs.lifecycle import (
    IdempotencyConflict,
    check_idempotency_key,
    check_priority,
    check_queue,
    create_run,
    request_fingerprint,
)
from lab.runs.limits import check_new_runs, check_sweep_size
from lab.text import clean_text
from trainer.config import ExperimentConfig
from trainer.errors import FieldError
from trainer.studies.definition import StudyDefinition, check_overrides


def expand_grid(
    grid: Mapping[str, Sequence[Any]], seeds: Sequence[int]
) -> list[tuple[str, dict[str, Any]]]:
    """(variant label, overrides) for every combination of grid values x seeds.

    A label names only the fields that vary over the grid (more than one value),
    by their dotted paths (``rollout.router_noise=0.2, stabilizers.replay.mode=r3``):
    a field given one value is the same in every variant and says nothing about
    which one a run is; a leaf name alone (``mode``) is ambiguous across sections.
    """
    if not isinstance(grid, Mapping):
        raise FieldError([("grid", "the grid must map field paths to lists of values")])
    errors = []
    for path, values in grid.items():
        if not isinstance(values, list | tuple) or not values:
            errors.append((f"grid.{path}", "give a non-empty list of values"))
    if not isinstance(seeds, list | tuple) or not seeds:
        errors.append(("seeds", "give at least one seed"))
    elif not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds):
        errors.append(("seeds", "seeds must be non-negative integers"))
    if errors:
        raise FieldError(errors)
    paths = list(grid)
    # Count before expanding: a grid of many long lists is a huge product.
    count = len(seeds)
    for values in grid.values():
        count *= len(values)
    check_sweep_size(count)
    combos = list(itertools.product(*(grid[p] for p in paths)))
    varied = [p for p in paths if len({repr(v) for v in grid[p]}) > 1]
    out = []
    for combo in combos:
        chosen = dict(zip(paths, combo, strict=True))
        label = ", ".join(f"{p}={chosen[p]}" for p in varied)
        for seed in seeds:
            overrides = dict(zip(paths, combo, strict=True))
            overrides["run.seed"] = seed
            out.append((label or "base", overrides))
    return out


def preview_sweep(
    base_config: Mapping[str, Any], grid: Mapping[str, Sequence[Any]], seeds: Sequence[int]
) -> list[tuple[str, ExperimentConfig]]:
    """Validate every run of the sweep; raises FieldError naming grid.<path> on a bad value."""
    runs = []
    for label, overrides in expand_grid(grid, seeds):
        try:
            cfg = resolve_config(base_config, None, overrides)
        except FieldError as exc:
            bad = [
                (f"grid.{strip_config_path(p)}" if strip_config_path(p) in grid else p, m)
                for p, m in exc.errors
            ]
            raise FieldError(bad) from None
        runs.append((label, cfg))
    return runs


def create_sweep(
    *,
    owner,
    experiment: Experiment,
    base_config: Mapping[str, Any],
    grid: Mapping[str, Sequence[Any]],
    seeds: Sequence[int],
    queue: str | None = None,
    name: str = "",
    priority: int | None = None,
    idempotency_key: str = "",
) -> Sweep:
    """Validate every combination first; store the sweep and its runs only if all pass.
    Every run queues at ``priority`` (the default when None).

    With an ``idempotency_key`` the owner already used, the sweep stored then is
    returned if this request asks for the same sweep (``lifecycle.is_replay``), an
    ``IdempotencyConflict`` if not; the database's unique (owner, key) decides
    between racing requests, so one key stores one sweep."""
    check_can_queue(owner, experiment)
    queue = check_queue(queue)
    priority = check_priority(priority)
    check_priority_allowed(owner, priority)
    name = clean_text("name", name, max_length=200)
    key = check_idempotency_key(idempotency_key)
    planned = preview_sweep(base_config, grid, seeds)
    fingerprint = request_fingerprint(
        experiment=experiment.pk,
        base_config=base_config,
        grid=grid,
        seeds=list(seeds),
        queue=queue,
        name=name,
        priority=priority,
    )
    if key and (earlier := Sweep.objects.filter(owner=owner, idempotency_key=key).first()):
        return _same_sweep_or_conflict(earlier, fingerprint, key)
    check_new_runs(owner, [cfg for _, cfg in planned])
    try:
        with transaction.atomic():
            sweep = Sweep.objects.create(
                experiment=experiment,
                owner=owner,
                name=name,
                base_config=dict(base_config),
                grid=dict(grid),
                seeds=list(seeds),
                queue=queue,
                idempotency_key=key,
                request_fingerprint=fingerprint if key else "",
            )
            for label, cfg in planned:
                create_run(
                    owner=owner,
                    experiment=experiment,
                    config=cfg,
                    queue=queue,
                    priority=priority,
                    variant=label,
                    sweep=sweep,
                )
    except IntegrityError:
        earlier = Sweep.objects.filter(owner=owner, idempotency_key=key).first() if key else None
        if earlier is None:
            raise
        return _same_sweep_or_conflict(earlier, fingerprint, key)
    return sweep


def _same_sweep_or_conflict(earlier: Sweep, fingerprint: str, key: str) -> Sweep:
    if earlier.request_fingerprint != fingerprint:
        raise IdempotencyConflict(key, f"sweep {earlier.pk}")
    earlier._idempotent_replay = True  # type: ignore[attr-defined]
    return earlier


@transaction.atomic
def create_study_sweep(
    *,
    owner,
    experiment: Experiment,
    definition: Mapping[str, Any],
    queue: str | None = None,
    overrides: Sequence[str] = (),
    priority: int | None = None,
) -> Sweep:
    """Queue a stability study (trainer/studies/definition.py) as a sweep: one run per variant x seed,
    each at ``priority`` (the default when None).

    The same definition that ``python -m trainer study`` runs; every config is
    validated first (errors name ``variants.<name>.<field>``), so a bad study
    stores nothing.
    """
    check_can_queue(owner, experiment)
    queue = check_queue(queue)
    priority = check_priority(priority)
    check_priority_allowed(owner, priority)
    study = StudyDefinition.from_dict(dict(definition))
    check_overrides(study, list(overrides))  # the CLI's rule: never redefine a variant
    check_sweep_size(len(study.variants) * len(study.seeds), field="variants")
    # Seed-major, as the CLI runs a study: the first runs to finish already
    # compare every variant, and a study cut short covers them all evenly.
    planned = [
        (variant.name, study.config_for(variant, seed, list(overrides)))
        for seed in study.seeds
        for variant in study.variants
    ]
    for variant_name, cfg in planned:  # a study names its configs outside resolve_config
        check_reward_function(cfg.task, prefix=f"variants.{variant_name}.")
    check_new_runs(owner, [cfg for _, cfg in planned])
    sweep = Sweep.objects.create(
        experiment=experiment,
        owner=owner,
        name=(study.name or "study")[:200],
        base_config=planned[0][1].to_dict(),
        grid={},
        seeds=list(study.seeds),
        queue=queue,
        study=dict(definition),
    )
    for variant, cfg in planned:
        create_run(
            owner=owner,
            experiment=experiment,
            config=cfg,
            queue=queue,
            priority=priority,
            variant=variant,
            sweep=sweep,
        )
    return sweep
