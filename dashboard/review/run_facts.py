"""What the run page and the compare page say about a run's model and data."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from lab.assets.models import RegisteredDataset, RegisteredModel
from lab.runs.exports import last_checkpoint_step
from trainer.config import ExperimentConfig
from trainer.model.param_count import format_params, model_params


def run_model_facts(config: Mapping[str, Any] | None) -> dict[str, str]:
    """``{"model", "family", "params", "data"}`` as display text for a run's stored config;
    empty when the config no longer validates."""
    if not config:
        return {}
    try:
        cfg = ExperimentConfig.model_validate(config)
    except (ValidationError, ValueError):
        return {}
    model, task = cfg.model, cfg.task
    facts = {"model": "the lab's builtin model", "family": model.family}
    if model.source != "builtin":
        registered = RegisteredModel.objects.filter(path=model.source).first()
        facts["model"] = f"{registered.name} ({model.source})" if registered else model.source
        if model.family == "builtin":  # a raw path: the worker reads the shape
            facts["family"] = "read from the checkpoint when the run starts"
            facts["params"] = ""
            return facts | {"data": _data_text(cfg)}
    vocab = model.vocab_size
    if vocab is None:
        from trainer.tasks.factory import make_task

        vocab = make_task(task).tokenizer.vocab_size
    total = model_params(model, vocab)
    active = model_params(model, vocab, active=True)
    facts["params"] = f"{format_params(total)} parameters" + (
        f", {format_params(active)} active" if model.is_moe else ""
    )
    return facts | {"data": _data_text(cfg)}


def _data_text(cfg: ExperimentConfig) -> str:
    task = cfg.task
    if task.name != "text":
        return f"built-in task {task.name}"
    registered = RegisteredDataset.objects.filter(path=task.data_file).first()
    name = f"{registered.name} ({task.data_file})" if registered else task.data_file
    return f"{name}, {task.verifier} verifier"


def export_command(run) -> str:
    """The command that writes a finished run's policy as a Hugging Face checkpoint
    (``python -m trainer export``), when its folder holds a checkpoint; else ''.
    The step is the run's last (the checkpoint a finished run keeps)."""
    step = last_checkpoint_step(run)
    if step is None:
        return ""
    name = f"run-{run.pk:06d}-step{step}-hf"
    return f"python -m trainer export {run.run_dir} --step {step} --out {name}"
