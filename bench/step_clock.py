"""Wall AND CPU time of every RL step of a trainer run, taken from the bench side.

The trainer's ``time/*`` metrics are wall clock: on a loaded machine they say
as much about the neighbours as about the step. ``StepClock`` wraps the loop's
step function and its phase clock in ``trainer.run.runner`` (no trainer change)
so that each step also records its CPU time, per phase (rollout, measurement
forward, update) where the step takes its four phase stamps. Used in process
(``with StepClock() as clock: train(...)``) and, for torchrun ranks, as a
module that runs the trainer CLI under the clock and writes one file per rank:

    python -m bench.step_clock OUT_DIR run --preset moe-grpo --out RUN_DIR ...

writes ``OUT_DIR/rank{RANK}.json`` (RANK from torchrun, 0 without it).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from bench.common import Stopwatch, cpu_now

PHASES = ("rollout", "mismatch", "update")


class StepClock:
    """Patches ``trainer.run.runner._rl_step`` and its ``phase_clock`` while open;
    ``steps`` holds one dict per step: wall_s, cpu_s and <phase>_cpu_s."""

    def __init__(self, scope: str = "thread") -> None:
        self.scope = scope
        self.steps: list[dict[str, float]] = []
        self._saved: tuple | None = None

    def __enter__(self) -> StepClock:
        from trainer.run import runner

        missing = [n for n in ("_rl_step", "phase_clock") if not hasattr(runner, n)]
        if missing:
            raise RuntimeError(f"trainer.run.runner has no {missing}: update bench/step_clock.py")
        step_fn, phase_clock = runner._rl_step, runner.phase_clock
        self._saved = (runner, step_fn, phase_clock)
        stamps: list[float] = []

        def clocked_phase(device):
            value = phase_clock(device)
            stamps.append(cpu_now(self.scope))
            return value

        def clocked_step(*args, **kwargs):
            stamps.clear()
            watch = Stopwatch(self.scope)
            metrics = step_fn(*args, **kwargs)
            spent = watch.elapsed()
            record = {"wall_s": spent.wall, "cpu_s": spent.cpu}
            if len(stamps) == len(PHASES) + 1:
                for name, start, end in zip(PHASES, stamps, stamps[1:], strict=False):
                    record[f"{name}_cpu_s"] = end - start
            self.steps.append(record)
            return metrics

        runner._rl_step, runner.phase_clock = clocked_step, clocked_phase
        return self

    def __exit__(self, *exc) -> None:
        runner, step_fn, phase_clock = self._saved
        runner._rl_step, runner.phase_clock = step_fn, phase_clock


def read_rank_files(folder: Path) -> dict[int, list[dict[str, float]]]:
    """{rank: per-step records} written by this module's command line."""
    return {
        int(p.stem.removeprefix("rank")): json.loads(p.read_text())
        for p in sorted(folder.glob("rank*.json"))
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out, trainer_args = Path(argv[0]), argv[1:]
    from trainer.cli import main as trainer_main

    # A rank's gloo collectives run in gloo's own threads: the process's CPU.
    with StepClock(scope="process") as clock:
        code = trainer_main(trainer_args)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{os.environ.get('RANK', '0')}.json").write_text(json.dumps(clock.steps))
    return code


if __name__ == "__main__":
    raise SystemExit(main())
