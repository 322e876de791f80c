"""Old config shapes, still accepted for one release: rewrite them to the current one.

Before the regrouping ``stabilizers`` was one flat section and ``task`` one model
for every task kind. ``migrate(data)`` rewrites those paths to their owners'
sub-sections on a plain dict (before validation, so saved experiments, presets
and ``--set`` overrides in the old shape still load) and returns one message per
rewritten path; ``ExperimentConfig`` issues them as ``ConfigDeprecationWarning``
and the CLI prints them. See docs/design.md, "contracts: config schema".
"""

from __future__ import annotations

import copy
from typing import Any

# Old flat ``stabilizers.<key>`` -> new path below ``stabilizers`` or at the root.
STABILIZER_MOVES: dict[str, tuple[str, ...]] = {
    "routing_replay": ("stabilizers", "replay", "mode"),
    "replay_warmup_steps": ("stabilizers", "replay", "warmup_steps"),
    "replay_warmup_keep_frac": ("stabilizers", "replay", "warmup_keep_frac"),
    "replay_compression": ("stabilizers", "replay", "compression"),
    "lb_from_natural_routing": ("stabilizers", "balance", "lb_from_natural_routing"),
    "router_kl_coef": ("stabilizers", "balance", "router_kl_coef"),
    "router_kl_buffer_steps": ("stabilizers", "balance", "router_kl_buffer_steps"),
    "aux_loss_coef": ("stabilizers", "balance", "aux_loss_coef"),
    "aux_loss_scope": ("stabilizers", "balance", "aux_loss_scope"),
    "z_loss_coef": ("stabilizers", "balance", "z_loss_coef"),
    "aux_free_bias": ("stabilizers", "balance", "aux_free_bias"),
    "aux_free_bias_rate": ("stabilizers", "balance", "aux_free_bias_rate"),
    "gradient_surgery": ("stabilizers", "surgery", "enabled"),
    "surgery_scope": ("stabilizers", "surgery", "scope"),
    "noisy_gating_init_std": ("stabilizers", "noisy_gating", "init_std"),
    "tis_cap": ("stabilizers", "is_correction", "tis_cap"),
    "mis_low": ("stabilizers", "is_correction", "mis_low"),
    "mis_high": ("stabilizers", "is_correction", "mis_high"),
    "icepop_low": ("stabilizers", "is_correction", "icepop_low"),
    "icepop_high": ("stabilizers", "is_correction", "icepop_high"),
    "per_expert_grad_clip": ("optim", "per_expert_grad_clip"),
    "expert_lr_scale": ("optim", "expert_lr_scale"),
    "router_lr_scale": ("optim", "router_lr_scale"),
}

# Old scalar switches whose name is now a sub-section: the scalar becomes one field of it.
STABILIZER_SWITCHES: dict[str, str] = {
    "is_correction": "kind",  # "tis" -> is_correction.kind
    "noisy_gating": "enabled",  # true -> noisy_gating.enabled
}

# Old task fields of the sort kind -> their names in the sort task's model.
SORT_RENAMES = {"sort_min_len": "min_len", "sort_max_len": "max_len", "sort_max_value": "max_value"}
ARITHMETIC_ONLY = ("operations", "min_digits", "max_digits", "scratchpad")
TASK_KINDS = ("arithmetic", "sort", "text")


def _put(data: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = data
    for key in path[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = node[key] = {}
        node = child
    node[path[-1]] = value


def _dotted(path: tuple[str, ...]) -> str:
    return ".".join(path)


def _migrate_stabilizers(data: dict[str, Any], notes: list[str]) -> None:
    st = data.get("stabilizers")
    if not isinstance(st, dict):
        return
    for old, new in STABILIZER_MOVES.items():
        if old in st:
            _put(data, new, st.pop(old))
            notes.append(f"stabilizers.{old} is deprecated; use {_dotted(new)}")
    for old, field in STABILIZER_SWITCHES.items():
        value = st.get(old)
        if old not in st or isinstance(value, dict):
            continue
        del st[old]
        new = ("stabilizers", old, field)
        _put(data, new, value)
        notes.append(f"stabilizers.{old} is deprecated; use {_dotted(new)}")


def _migrate_task(data: dict[str, Any], notes: list[str]) -> None:
    task = data.get("task")
    if not isinstance(task, dict):
        return
    # The task kind picks the model (a tagged union); it defaulted to arithmetic.
    kind = task.setdefault("name", "arithmetic")
    for old, new in SORT_RENAMES.items():
        if old not in task:
            continue
        value = task.pop(old)
        if kind == "sort":
            task[new] = value
            notes.append(f"task.{old} is deprecated; use task.{new} (with task.name='sort')")
        else:
            notes.append(f"task.{old} applies to task.name='sort' only; ignored")
    if kind == "sort":
        for old in ARITHMETIC_ONLY:
            if old in task:
                del task[old]
                notes.append(f"task.{old} applies to task.name='arithmetic' only; ignored")


# Removed ``run.collapse`` fields: the drop rule's absolute floor is now the noise margin
# (run.collapse.noise_z, trainer/analysis/collapse.py), so a fixed arming level no longer exists.
REMOVED_COLLAPSE_FIELDS = {
    "floor": "run.collapse.floor is removed (ignored): the drop rule is armed by the batch "
    "noise margin, run.collapse.noise_z",
}


def _migrate_collapse(data: dict[str, Any], notes: list[str]) -> None:
    run = data.get("run")
    collapse = run.get("collapse") if isinstance(run, dict) else None
    if not isinstance(collapse, dict):
        return
    for old, note in REMOVED_COLLAPSE_FIELDS.items():
        if old in collapse:
            del collapse[old]
            notes.append(note)


def migrate(data: Any) -> tuple[Any, list[str]]:
    """``(data in the current shape, deprecation messages)``; a non-dict passes through.

    Old and new keys may be mixed (a new-shape preset under old ``--set`` paths):
    an old key then overrides the new field it maps to, as a later override would.
    """
    if not isinstance(data, dict):
        return data, []
    out = copy.deepcopy(data)
    notes: list[str] = []
    _migrate_stabilizers(out, notes)
    _migrate_task(out, notes)
    _migrate_collapse(out, notes)
    return out, notes
