"""Command line (DESIGN.md 3.2).

    python -m trainer run (--config cfg.json | --preset NAME) [--set a.b=value ...]
                          --out RUN_DIR [--resume]
    python -m trainer presets
    python -m trainer schema

A bad config prints the offending field paths and exits with code 2 before
anything is written.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from trainer.config import ConfigError, ExperimentConfig, apply_overrides, validate_config
from trainer.presets import list_presets, preset_dict

EXIT_BAD_CONFIG = 2


def build_config(
    config_path: str | None, preset: str | None, overrides: list[str]
) -> ExperimentConfig:
    """Resolve --config / --preset plus --set overrides into a validated config."""
    data: dict[str, Any] = {}
    if config_path:
        try:
            data = json.loads(Path(config_path).read_text())
        except FileNotFoundError:
            raise ConfigError([("--config", f"no such file: {config_path}")]) from None
        except json.JSONDecodeError as exc:
            raise ConfigError([("--config", f"not valid JSON: {exc}")]) from None
        if not isinstance(data, dict):
            raise ConfigError([("--config", "the file must hold a JSON object")])
    elif preset:
        data = preset_dict(preset)
    return validate_config(apply_overrides(data, overrides))


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
    study.add_argument("definition", help="STUDY.json, or a built-in name: quick | full")
    study.add_argument("--out", required=True)
    study.add_argument("--set", dest="overrides", action="append", default=[])
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
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
            cfg = build_config(args.config, args.preset, args.overrides)
            from trainer.runner import run_from_cli

            return run_from_cli(cfg, Path(args.out), resume=args.resume)
        if args.command == "demo":
            from trainer.demo import run_demo

            return run_demo(Path(args.out), steps=args.steps)
        if args.command == "study":
            from trainer.study import run_study_cli

            return run_study_cli(args.definition, Path(args.out), args.overrides)
    except ConfigError as exc:
        print("invalid config:", file=sys.stderr)
        for path, msg in exc.errors:
            print(f"  {path or '(root)'}: {msg}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    return 1
