"""Command line (docs/design.md, "contracts: CLI").

    python -m trainer run (--config cfg.json | --preset NAME) [--set a.b=value ...]
                          --out RUN_DIR [--resume] [--lease-file PATH --lease-s S]
    python -m trainer presets
    python -m trainer schema
    python -m trainer export RUN_DIR --step N --out DIR [--dtype bfloat16] [--replace]

A bad config prints the offending field paths and exits with code 2 before
anything is written (into a run folder that exists already, the one the
platform prepared, it leaves them as field_errors.json). A run folder held
by another trainer exits with code 73 at once; an expired lease (the supervisor stopped renewing --lease-file)
exits with code 76 without a checkpoint (trainer/run_folder/guard.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

from trainer.config import ConfigDeprecationWarning, ExperimentConfig, apply_overrides
from trainer.config.presets import list_presets, preset_dict
from trainer.errors import BAD_INPUT_EXIT_CODE, FieldError
from trainer.hf.loader import resolve_model_source
from trainer.run_folder.files import EXIT_CODE_FILE, write_field_errors
from trainer.run_folder.guard import (
    LEASE_EXPIRED_EXIT_CODE,
    RUN_DIR_BUSY_EXIT_CODE,
    Lease,
    LeaseExpired,
    RunDirBusy,
    die_with_launcher,
)
from trainer.studies.definition import BUILTIN_STUDIES
from trainer.validation import validate_config


def build_config(
    config_path: str | None, preset: str | None, overrides: list[str]
) -> ExperimentConfig:
    """Resolve --config / --preset plus --set overrides into a validated config."""
    data: dict[str, Any] = {}
    if config_path:
        try:
            data = json.loads(Path(config_path).read_text())
        except FileNotFoundError:
            raise FieldError([("--config", f"no such file: {config_path}")]) from None
        except json.JSONDecodeError as exc:
            raise FieldError([("--config", f"not valid JSON: {exc}")]) from None
        if not isinstance(data, dict):
            raise FieldError([("--config", "the file must hold a JSON object")])
    elif preset:
        data = preset_dict(preset)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConfigDeprecationWarning)
        cfg = validate_config(apply_overrides(data, overrides))
        # model.source: the checkpoint's config.json decides the shape (docs/models.md).
        cfg = resolve_model_source(cfg)
    for warning in caught:
        if issubclass(warning.category, ConfigDeprecationWarning):
            print(f"deprecated: {warning.message}", file=sys.stderr)
        else:
            warnings.showwarning(
                warning.message, warning.category, warning.filename, warning.lineno
            )
    return cfg


def check_input_files(cfg: ExperimentConfig) -> None:
    """The checkpoint folder loads (``trainer.hf.validate``: safetensors headers,
    tensor shapes against config.json, the tokenizer), or a FieldError."""
    if cfg.model.source == "builtin":
        return
    from trainer.hf.validate import validate_checkpoint

    errors = validate_checkpoint(cfg.model.source)
    if errors:
        raise FieldError(errors)


def check_launched_nodes(nodes: int, gpus: int) -> None:
    """A run over several hosts needs torchrun on each (``--nnodes``); started
    any other way it would train on one host and call it several."""
    if nodes == 1:
        return
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != nodes * gpus:
        raise FieldError(
            [
                (
                    "run.nodes",
                    f"{nodes} nodes x {gpus} ranks need torchrun --nnodes={nodes} "
                    f"--nproc_per_node={gpus} on every host (this process sees WORLD_SIZE={world}); "
                    "submit it to the platform's queue, which gang-schedules it, or set run.nodes=1",
                )
            ]
        )


def _precision_list(text: str) -> list[str]:
    values = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in values if p not in ("fp32", "bf16", "fp16", "fp8")]
    if not values or bad:
        raise FieldError([("--precisions", "give fp32, bf16, fp16 or fp8, comma-separated")])
    return values


def _int_list(text: str, flag: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise FieldError([(flag, "give comma-separated integers, e.g. 0,1,2")]) from None


def _float_list(text: str, flag: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise FieldError([(flag, "give comma-separated numbers, e.g. 0,0.1,0.2")]) from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m trainer",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="train one run")
    source = run.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", help="JSON config file")
    source.add_argument("--preset", help="named preset (see `presets`)")
    run.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="a.b=value",
        help="override a field (JSON value)",
    )
    run.add_argument("--out", required=True, help="run folder")
    run.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    run.add_argument(
        "--lease-file",
        help="file a supervisor touches while it owns this attempt; stop when it goes stale",
    )
    run.add_argument(
        "--lease-s", type=float, default=30.0, help="seconds without a touch before stopping"
    )

    sub.add_parser("presets", help="list presets")
    sub.add_parser("schema", help="print the config JSON Schema")

    show = sub.add_parser("config", help="print the resolved config")
    show_source = show.add_mutually_exclusive_group()
    show_source.add_argument("--config")
    show_source.add_argument("--preset")
    show.add_argument("--set", dest="overrides", action="append", default=[])

    demo = sub.add_parser("demo", help="short dense vs MoE comparison with a printed table")
    demo.add_argument("--out", default="var/demo")
    demo.add_argument("--steps", type=int, default=20)

    study = sub.add_parser("study", help="run a stability study definition")
    study.add_argument(
        "definition", help=f"STUDY.json, or a built-in name: {' | '.join(BUILTIN_STUDIES)}"
    )
    study.add_argument("--out", required=True)
    study.add_argument("--set", dest="overrides", action="append", default=[])
    study.add_argument(
        "--variants", help="comma-separated variant names: run only this slice of the study"
    )
    study.add_argument("--seeds", help="comma-separated seeds: run only these of the study's seeds")
    study.add_argument(
        "--budget-s", type=float, help="seconds: run what fits, stop cleanly (resumes later)"
    )
    study.add_argument(
        "--bases",
        dest="bases_dir",
        help="folder of exported bases to import (OUT/bases of a study)",
    )
    study.add_argument(
        "--mps",
        choices=("auto", "on", "off"),
        default="auto",
        help="CUDA MPS for runs packed on a GPU (auto: when several share one and the host has it)",
    )
    study.add_argument("--dry", action="store_true", help="print the plan only: how many runs fit")
    study.add_argument(
        "--rows",
        nargs="?",
        const="trainer/studies/measured/step_times.json",
        help="merge the measured rows of the --out folder into this rows file and stop",
    )
    study.add_argument(
        "--device", help="the device kind the plan is for (e.g. 'NVIDIA H200'; default: this one)"
    )

    report = sub.add_parser(
        "causal-report", help="the pre-registered analysis of a causal study's run folders"
    )
    report.add_argument("--study", default="causal", help="STUDY.json or a built-in name")
    report.add_argument("--out", required=True, help="the study folder")

    compact = sub.add_parser(
        "compact",
        help="gzip the metrics.jsonl of every finished run under a study folder (committed results)",
    )
    compact.add_argument("out", metavar="OUT", help="a study folder (or one run folder)")

    again = sub.add_parser(
        "reproduce",
        help="train a recorded run again and compare every logged value with its record",
    )
    again.add_argument("run_dir", metavar="RUN_DIR", help="a run folder (config.json, metrics)")
    again.add_argument("--out", required=True, help="a new folder for the rerun")
    again.add_argument("--steps", type=int, help="compare the first N steps (default: all)")

    calibrate = sub.add_parser(
        "calibrate", help="router noise sigma -> routing gap, k3, SDI and expert balance per base"
    )
    calibrate.add_argument("--study", default="causal", help="STUDY.json or a built-in name")
    calibrate.add_argument("--variant", help="default: the study's first MoE variant")
    calibrate.add_argument("--bases", default="0,1,2,3", help="comma-separated base seeds")
    calibrate.add_argument("--sigmas", default="0,0.05,0.1,0.2,0.4")
    calibrate.add_argument("--kind", choices=("fixed", "fresh"), default="fixed")
    calibrate.add_argument(
        "--precisions",
        default="fp32",
        help="comma-separated rollout engine precisions (fp32, bf16, fp16, fp8): the real "
        "engine gap against the fp32 training forward, beside the router noise",
    )
    calibrate.add_argument("--batches", type=int, default=2)
    calibrate.add_argument("--out", required=True, help="JSON file (the table goes beside it)")

    export = sub.add_parser("export", help="write a run's policy as a Hugging Face checkpoint")
    export.add_argument("run_dir", metavar="RUN_DIR", help="run folder")
    export.add_argument("--step", type=int, required=True, help="RL step of the checkpoint")
    export.add_argument("--out", required=True, help="folder for the HF checkpoint")
    export.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    export.add_argument(
        "--replace", action="store_true", help="replace a non-empty --out folder as a whole"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; a reader that closes the pipe early (``| head``) ends it quietly."""
    try:
        args = _parser().parse_args(argv)
        code = _dispatch(args)
        if args.command == "run":
            report_exit_code(Path(args.out), code)
        sys.stdout.flush()  # inside the try: a small output is still buffered here
        return code
    except BrokenPipeError:
        # Python flushes stdout again at exit; point it at devnull so that flush
        # cannot raise a second time (https://docs.python.org/3/library/signal.html#note-on-sigpipe).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


def report_exit_code(run_dir: Path, code: int) -> None:
    """Under torchrun, leave a meaningful exit code in the run folder: torchrun
    itself exits 1 for any failed rank, and the platform's worker must still
    tell a bad config (fail now) from a busy folder or an expired lease (retry)."""
    if "LOCAL_RANK" not in os.environ:
        return
    if code not in (BAD_INPUT_EXIT_CODE, RUN_DIR_BUSY_EXIT_CODE, LEASE_EXPIRED_EXIT_CODE):
        return
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        tmp = run_dir / f"{EXIT_CODE_FILE}.{os.getpid()}"
        tmp.write_text(str(code))
        os.replace(tmp, run_dir / EXIT_CODE_FILE)
    except OSError:  # an unwritable folder: the exit status and the log still say it
        pass


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "presets":
        width = max(len(name) for name, _ in list_presets())
        for name, description in list_presets():
            print(f"{name:<{width}}  {description}")
        return 0
    if args.command == "schema":
        from trainer.config import json_schema

        print(json.dumps(json_schema(), indent=2))
        return 0
    try:
        if args.command == "config":
            cfg = build_config(args.config, args.preset, args.overrides)
            print(json.dumps(cfg.to_dict(), indent=2))
            return 0
        if args.command == "run":
            die_with_launcher()  # under torchrun: a lost launcher is a lost host
            cfg = build_config(args.config, args.preset, args.overrides)
            check_launched_nodes(cfg.run.nodes, cfg.run.gpus)
            from trainer.hf.tokenizer import install_checkpoint_tokenizer
            from trainer.tasks import make_task

            # Every input checked before anything is written into --out: the
            # checkpoint's headers, shapes and tokenizer, the data file's rows, an
            # imported model's tokenizer and its prompt lengths, a custom reward
            # function (offered here, and it loads in its own process).
            check_input_files(cfg)
            task = make_task(cfg.task)
            install_checkpoint_tokenizer(task, cfg)
            try:
                task.start()
            finally:
                task.close()
            from trainer.run.runner import run_from_cli

            lease = Lease(Path(args.lease_file), args.lease_s) if args.lease_file else None
            try:
                return run_from_cli(cfg, Path(args.out), resume=args.resume, lease=lease)
            except RunDirBusy as exc:
                print(f"error: {exc}", file=sys.stderr)
                return RUN_DIR_BUSY_EXIT_CODE
            except LeaseExpired as exc:
                print(f"stopped: {exc}", file=sys.stderr)
                return LEASE_EXPIRED_EXIT_CODE
        if args.command == "demo":
            from trainer.studies.demo import run_demo

            return run_demo(Path(args.out), steps=args.steps)
        if args.command == "export":
            from trainer.run.export import export_run

            out = export_run(
                Path(args.run_dir), args.step, Path(args.out), args.dtype, replace=args.replace
            )
            print(f"wrote {out}")
            return 0
        if args.command == "causal-report":
            from trainer.analysis.causal_report import causal_report
            from trainer.studies.definition import load_definition

            causal_report(load_definition(args.study), Path(args.out))
            print((Path(args.out) / "causal.md").read_text())
            return 0
        if args.command == "compact":
            from trainer.run_folder.files import SUMMARY_FILE, compact_run

            done = sum(compact_run(p.parent) for p in sorted(Path(args.out).rglob(SUMMARY_FILE)))
            print(f"compacted {done} finished run folders under {args.out}")
            return 0
        if args.command == "reproduce":
            from trainer.studies.reproduce import describe, reproduce

            comparison = reproduce(Path(args.run_dir), Path(args.out), args.steps)
            print(describe(comparison))
            return 0 if comparison.identical else 1
        if args.command == "calibrate":
            from trainer.studies.calibration import calibrate_study
            from trainer.studies.definition import load_definition

            print(
                calibrate_study(
                    load_definition(args.study),
                    _int_list(args.bases, "--bases"),
                    _float_list(args.sigmas, "--sigmas"),
                    Path(args.out),
                    batches=args.batches,
                    kind=args.kind,
                    variant=args.variant,
                    precisions=_precision_list(args.precisions),
                )
            )
            return 0
        if args.command == "study":
            from trainer.studies.study import run_study_cli

            return run_study_cli(
                args.definition,
                Path(args.out),
                args.overrides,
                args.variants,
                args.seeds,
                budget_s=args.budget_s,
                mps=args.mps,
                dry=args.dry,
                device=args.device,
                rows=args.rows,
                bases_dir=Path(args.bases_dir) if args.bases_dir else None,
            )
    except FieldError as exc:
        print("invalid config:", file=sys.stderr)
        for path, msg in exc.errors:
            print(f"  {path or '(root)'}: {msg}", file=sys.stderr)
        if args.command == "run":  # the platform's run form shows them at their fields
            write_field_errors(Path(args.out), exc.errors)
        return BAD_INPUT_EXIT_CODE
    except OSError as exc:  # a folder that cannot be written or read: say which, no traceback
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1
    return 1
