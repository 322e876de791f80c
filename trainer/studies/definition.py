"""A study definition: variants x seeds over one base config, loaded from JSON.

A study definition is JSON (the platform runs the same definition as a sweep):

    {
      "name": "quick",
      "description": "...",
      "base": {"preset": "moe-grpo", "set": ["run.steps=60", ...]},
      "seeds": [0, 1, 2],
      "variants": [
        {"name": "dense-grpo", "set": ["model.n_experts=0"]},
        {"name": "moe-grpo-r3", "set": ["stabilizers.replay.mode=\\"r3\\""]}
      ]
    }

Each run's config = base preset + base ``set`` + the variant's ``set`` +
``run.seed``, and the same seed in every field of ``"seed_fields"`` (e.g.
``["warm_start.seed"]``: each seed then starts from its own independently
warm-started base, so the seeds replicate the base as well as the RL run;
with ``"bases": N`` the fields get ``seed % N`` instead, N bases shared by the
seeds in turn). Running it: ``trainer.studies.study``; its tables and report:
``trainer.studies.results``. Torch-free: the platform runs a definition as a sweep.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from trainer.config import ExperimentConfig, apply_overrides
from trainer.config.presets import preset_dict
from trainer.errors import FieldError
from trainer.validation import validate_config

# Every definition shipped in trainer/studies/ is a built-in study, by its file name.
BUILTIN_STUDIES = tuple(
    sorted(
        entry.name.removesuffix(".json")
        for entry in resources.files("trainer.studies").iterdir()
        if entry.name.endswith(".json")
    )
)


@dataclass
class Variant:
    name: str
    overrides: list[str] = field(default_factory=list)


@dataclass
class StudyDefinition:
    name: str
    description: str
    base_preset: str
    base_overrides: list[str]
    seeds: list[int]
    variants: list[Variant]
    parallel: int = 2
    # The arm the log-rank tests compare with (default: moe-grpo when present, else the first).
    reference: str | None = None
    # Dose-response layout: {"axis": "rollout.precision", "levels": [...], "arms": [...]};
    # the variant of arm A at level L is named "A-L".
    dose: dict[str, Any] | None = None
    # Config fields that every seed also sets to the seed (see the module docstring).
    seed_fields: list[str] = field(default_factory=list)
    # With ``bases`` = N the seed fields get seed % N: seeds k, k + N, ... share base k,
    # so a cell's runs spread over N independently warm-started bases.
    bases: int | None = None
    # "causal" / "edge": also write the pre-registered analysis (trainer.analysis.causal_report,
    # with the causal study's tests H1-H3 or the near-edge study's, trainer.analysis.edge_tests).
    analysis: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StudyDefinition:
        def need(obj: dict, key: str, where: str):
            if key not in obj:
                raise FieldError([(f"{where}{key}", "required")])
            return obj[key]

        base = need(data, "base", "")
        variants = need(data, "variants", "")
        if not isinstance(variants, list) or not variants:
            raise FieldError([("variants", "give at least one variant")])
        names = [need(v, "name", f"variants.{i}.") for i, v in enumerate(variants)]
        if len(set(names)) != len(names):
            raise FieldError([("variants", "variant names must be unique")])
        seeds = data.get("seeds", [0, 1, 2])
        if not seeds or not all(isinstance(s, int) and s >= 0 for s in seeds):
            raise FieldError([("seeds", "give a list of non-negative integer seeds")])
        study = cls(
            name=data.get("name", "study"),
            description=data.get("description", ""),
            base_preset=base.get("preset", "moe-grpo"),
            base_overrides=list(base.get("set", [])),
            seeds=list(seeds),
            variants=[Variant(v["name"], list(v.get("set", []))) for v in variants],
            parallel=int(data.get("parallel", 2)),
            reference=data.get("reference"),
            dose=data.get("dose"),
            seed_fields=_seed_fields(data.get("seed_fields", [])),
            bases=_bases(data.get("bases"), data.get("seed_fields")),
            analysis=_analysis(data.get("analysis")),
        )
        if study.reference is not None and study.reference not in names:
            raise FieldError([("reference", f"no variant named {study.reference!r}")])
        for variant in study.variants:  # fail before any run starts
            for seed in study.seeds[:1]:
                study.config_for(variant, seed)
        return study

    def base_of(self, seed: int) -> int:
        """The value the seed fields get for ``seed`` (the base it starts from)."""
        return seed % self.bases if self.bases else seed

    def config_for(self, variant: Variant, seed: int, extra: list[str] = ()) -> ExperimentConfig:
        data = apply_overrides(
            preset_dict(self.base_preset),
            [
                *self.base_overrides,
                *variant.overrides,
                *extra,
                f"run.seed={seed}",
                *(f"{path}={self.base_of(seed)}" for path in self.seed_fields),
            ],
        )
        try:
            return validate_config(data)
        except FieldError as exc:
            raise FieldError(
                [(f"variants.{variant.name}.{path}", msg) for path, msg in exc.errors]
            ) from None


ANALYSES = ("causal", "edge")  # edge: the near-edge study's registration (edge_tests)


def _analysis(value: Any) -> str | None:
    if value is not None and value not in ANALYSES:
        raise FieldError([("analysis", f"one of {', '.join(ANALYSES)}, or leave it out")])
    return value


def _bases(value: Any, seed_fields: Any) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise FieldError([("bases", "give a positive number of bases")])
    if not seed_fields:
        raise FieldError([("bases", 'needs seed_fields, e.g. ["warm_start.seed"]')])
    return value


def _seed_fields(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise FieldError([("seed_fields", 'give a list of config paths, e.g. ["warm_start.seed"]')])
    if "run.seed" in value:
        raise FieldError([("seed_fields", "run.seed is always the seed; list other fields")])
    return list(value)


def builtin_dict(name: str) -> dict[str, Any]:
    """A built-in study's definition (``BUILTIN_STUDIES``) as the JSON object it is stored as."""
    return json.loads(resources.files("trainer.studies").joinpath(f"{name}.json").read_text())


def load_definition(ref: str) -> StudyDefinition:
    """A path to STUDY.json, or a built-in name (``BUILTIN_STUDIES``)."""
    if ref in BUILTIN_STUDIES:
        return StudyDefinition.from_dict(builtin_dict(ref))
    else:
        path = Path(ref)
        if not path.exists():
            raise FieldError([("definition", f"no such file or built-in study: {ref}")])
        text = path.read_text()
    try:
        return StudyDefinition.from_dict(json.loads(text))
    except json.JSONDecodeError as exc:
        raise FieldError([("definition", f"not valid JSON: {exc}")]) from None


def select(study: StudyDefinition, variants: str | None, seeds: str | None) -> StudyDefinition:
    """The study restricted to some variants and/or seeds (a slice keeps the same run folders)."""
    chosen = study.variants
    if variants:
        names = [n.strip() for n in variants.split(",") if n.strip()]
        known = {v.name for v in study.variants}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise FieldError([("--variants", f"no such variant: {', '.join(unknown)}")])
        chosen = [v for v in study.variants if v.name in names]
    seed_list = study.seeds
    if seeds:
        try:
            seed_list = [int(x) for x in seeds.split(",") if x.strip()]
        except ValueError:
            raise FieldError([("--seeds", "give comma-separated integers, e.g. 0,1,2")]) from None
        if not seed_list or min(seed_list) < 0:
            raise FieldError([("--seeds", "give non-negative integer seeds")])
    return replace(study, variants=chosen, seeds=seed_list)


def check_overrides(study: StudyDefinition, overrides: list[str]) -> None:
    """``--set`` applies after every variant's own settings, so a path a variant
    sets would silently make that variant something else (``--set
    model.n_experts=16`` turns the dense variant, ``model.n_experts=0``, into
    a MoE): refuse it, naming the variants, and say where it belongs."""
    paths = {item.split("=", 1)[0].strip() for item in overrides}
    for path in sorted(paths):
        owners = [
            v.name
            for v in study.variants
            if any(o.split("=", 1)[0].strip() == path for o in v.overrides)
        ]
        if owners:
            message = (
                f"the variants {', '.join(owners)} set {path} themselves; "
                "put it in the study's base (a copy of the definition) instead"
            )
            raise FieldError([(f"--set {path}", message)])
