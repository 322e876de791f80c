"""Export a finished run's checkpoint as a Hugging Face folder.

    python -m trainer export RUN_DIR --step N --out DIR [--dtype bfloat16]

The run's side of the export: its config and checkpoint (``trainer.run.checkpoint``)
are read here, and the folder is written by ``trainer.hf.export.export_hf``. It
sits above the run so that the Hugging Face package below it needs nothing of
the loop (docs/design.md 1.3). The platform's worker calls it on the control
queue (``lab.runs.exports``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from trainer.config import ExperimentConfig
from trainer.errors import FieldError
from trainer.hf.export import DTYPES, export_hf
from trainer.hf.files import read_json_file
from trainer.run.checkpoint import checkpoint_path, load_checkpoint, read_sharded_policy
from trainer.run_folder.files import CONFIG_FILE, METRICS_FILE


def check_out_folder(run_dir: Path, out: Path) -> None:
    """``out`` may not be the run folder, a folder holding it, or another run's folder:
    an export writes (and with ``--replace`` removes) all of ``out``, and once deleted
    the run it was meant to copy (or another one) with it."""
    run, target = run_dir.resolve(), out.resolve()
    if target == run or target in run.parents:
        raise FieldError(
            [
                (
                    "--out",
                    f"{out} holds the run folder {run_dir}; export into a new folder "
                    f"(e.g. {run_dir / 'exports' / 'step<N>'})",
                )
            ]
        )
    if (target / CONFIG_FILE).exists() and (
        (target / METRICS_FILE).exists() or checkpoint_path(target).exists()
    ):
        raise FieldError([("--out", f"{out} is a run folder; export into a new folder")])


def export_run(
    run_dir: Path, step: int, out: Path, dtype: str = "float32", replace: bool = False
) -> Path:
    """Export the policy of ``run_dir``'s checkpoint taken after ``step`` RL steps.

    The stored config is read as a schema only (no task is built): the export
    needs neither the run's data file nor its reward module.
    """
    config_file = run_dir / CONFIG_FILE
    check_out_folder(run_dir, out)
    if not config_file.exists():
        raise FieldError([("RUN_DIR", f"{run_dir} has no {CONFIG_FILE}; is it a run folder?")])
    if dtype not in DTYPES:
        raise FieldError([("--dtype", f"choose one of {', '.join(DTYPES)}")])
    try:
        cfg = ExperimentConfig.model_validate(read_json_file(config_file, "RUN_DIR"))
    except ValidationError as exc:
        raise FieldError([("RUN_DIR", f"{config_file} is not a valid run config: {exc}")]) from None
    ckpt = load_checkpoint(run_dir)
    if ckpt is None:
        raise FieldError([("RUN_DIR", f"{run_dir} has no checkpoint ({checkpoint_path(run_dir)})")])
    saved_step = int(ckpt["run_state"]["step"])
    if saved_step != step:
        raise FieldError(
            [("--step", f"the run keeps only its last checkpoint, taken after step {saved_step}")]
        )
    policy: dict[str, Any] = ckpt["policy"]
    if policy is None and ckpt.get("sharded"):  # an FSDP run: merge its shards
        policy = read_sharded_policy(run_dir, ckpt["sharded"])
    vocab_size = int(policy["tok_emb.weight"].shape[0])
    builtin_tokenizer = "byte" if cfg.task.name == "text" else "char"
    return export_hf(
        policy,
        cfg.model,
        vocab_size,
        out,
        dtype,
        replace=replace,
        builtin_tokenizer=builtin_tokenizer,
    )
