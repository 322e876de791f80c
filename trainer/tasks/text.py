"""Text tasks: prompts and verifiable answers from a local file (``task.name = "text"``).

    task = make_task(TextTaskConfig(data_file="/data/gsm8k/train.jsonl"))
    task.sample(16, rng); task.eval_set(); task.reward(problem, response)

A problem is one usable row of ``task.data_file`` (``trainer.tasks.text_data``):
its prompt (``prompt_field`` or ``prompt_template``), its canonical answer
(the verifier's reading of ``answer_field``) and the warm start's supervised
response (the answer field, e.g. a GSM8K solution ending ``#### 42``).
Rewards come from the configured verifier (``trainer.tasks.verifiers``),
with ``format_reward`` for a parsable but wrong final answer.

Held-out evaluation: with ``eval_file`` its usable rows are the evaluation
set and every row of ``data_file`` trains; without it the prompts are split
by hash as for the built-in tasks (``holdout.py``: about 10% held out).

Tokens: the checkpoint's tokenizer once a run installs it (``model.source``);
on the builtin model, UTF-8 bytes (``byte_tokenizer.py``). Rows skipped as
unusable are counted by reason in ``data_report()`` (logged at the start of a
run and written to summary.json).
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Iterable, Sequence
from functools import cached_property
from typing import Any

from trainer.config import ExperimentConfig, TextTaskConfig
from trainer.errors import FieldError
from trainer.tasks.base import Problem, Task, prompt_ids
from trainer.tasks.byte_tokenizer import ByteTokenizer
from trainer.tasks.holdout import HeldOutSplit
from trainer.tasks.reward_process import RewardFunctionError
from trainer.tasks.text_data import ProblemTable, build_problems, read_table, resolve_data_file
from trainer.tasks.verifiers import PythonVerifier, make_verifier


class TextTask(Task):
    cfg: TextTaskConfig

    def __init__(self, cfg: TextTaskConfig, tokenizer: Any = None) -> None:
        super().__init__(cfg, tokenizer or ByteTokenizer())
        try:
            self.verifier = make_verifier(
                cfg.verifier,
                cfg.tolerance,
                cfg.choice_labels,
                cfg.reward_function,
                cfg.reward_timeout_s,
            )
        except ValueError as exc:
            raise FieldError([("task.reward_function", str(exc))]) from None
        self._lengths: dict[Any, tuple[int, int]] = {}  # tokenizer -> lengths
        # task.max_prompt_tokens counts the tokens the run speaks, known only once its
        # tokenizer is installed (``tokens_known``): bytes overcount a checkpoint's.
        self._count_tokens = False

    # ----------------------------------------------------------- data
    def _load(self, value: str, path: str) -> ProblemTable:
        tokens = None
        if self._count_tokens and self.cfg.max_prompt_tokens is not None:

            def tokens(problem: Problem) -> int:
                return len(prompt_ids(self.tokenizer, problem))

        table = build_problems(
            read_table(resolve_data_file(value, path), path), self.cfg, self.verifier, tokens
        )
        if len(table.problems) < 2:
            reasons = table.describe_bad()
            raise FieldError(
                [
                    (
                        path,
                        f"{value} has {len(table.problems)} usable rows of {table.rows}"
                        + (f" ({reasons})" if reasons else "")
                        + "; check prompt_field, prompt_template and answer_field",
                    )
                ]
            )
        return table

    @cached_property
    def train_table(self) -> ProblemTable:
        return self._load(self.cfg.data_file, "task.data_file")

    @cached_property
    def eval_table(self) -> ProblemTable | None:
        if self.cfg.eval_file is None:
            return None
        return self._load(self.cfg.eval_file, "task.eval_file")

    def tokens_known(self) -> None:
        """Rebuild the tables (and what was derived from them) with the overlong-prompt
        filter in the run's tokens; nothing to do without ``max_prompt_tokens``."""
        if self._count_tokens or self.cfg.max_prompt_tokens is None:
            return
        self._count_tokens = True
        for derived in ("train_table", "eval_table", "split", "_eval_problems"):
            self.__dict__.pop(derived, None)
        self._lengths.clear()

    def data_report(self) -> dict[str, Any]:
        """Rows read and rows skipped (by reason), per file: for the log and summary.json."""
        report: dict[str, Any] = {}
        for key, table in (("data_file", self.train_table), ("eval_file", self.eval_table)):
            if table is not None:
                report[key] = {
                    "rows": table.rows,
                    "problems": len(table.problems),
                    "bad_rows": table.n_bad,
                    "bad_row_reasons": dict(table.bad_rows.most_common()),
                    "bad_row_lines": {why: lines for why, lines in table.bad_lines.items()},
                }
        return report

    # ----------------------------------------------------------- Task hooks
    def space_size(self) -> int:
        return len(self.train_table.problems)

    def all_specs(self) -> Iterable[Hashable]:
        return range(self.space_size())

    def draw_spec(self, rng: random.Random) -> Hashable:
        return rng.randrange(self.space_size())

    def prompt_of(self, spec: Hashable) -> str:
        return self.train_table.problems[spec].prompt  # type: ignore[index]

    def build(self, spec: Hashable) -> Problem:
        return self.train_table.problems[spec]  # type: ignore[index]

    def parse_answer(self, text: str) -> str | None:
        return self.verifier.extract(text)

    def longest_specs(self) -> Iterable[Hashable]:
        return self.all_specs()

    # ----------------------------------------------------------- held-out split
    @cached_property
    def split(self) -> HeldOutSplit:
        try:
            return super().split
        except ValueError as exc:
            raise FieldError(
                [("task.data_file", f"{exc}; add rows or set task.eval_file")]
            ) from None

    def is_held_out(self, problem_or_prompt: Problem | str) -> bool:
        if self.eval_table is not None:
            return False  # a separate evaluation file: every training row trains
        return super().is_held_out(problem_or_prompt)

    def sample(self, n: int, rng: random.Random) -> list[Problem]:
        if self.eval_table is None:
            return super().sample(n, rng)
        return [self.build(self.draw_spec(rng)) for _ in range(n)]

    @cached_property
    def _eval_problems(self) -> tuple[Problem, ...]:
        if self.eval_table is None:
            return super()._eval_problems
        problems = list(self.eval_table.problems)
        random.Random(self.cfg.eval_seed).shuffle(problems)
        return tuple(problems[: self.cfg.eval_size])

    # ----------------------------------------------------------- rewards
    def start(self) -> None:
        """A custom reward function's process, started (and the function loaded) now:
        a name this machine does not offer or cannot import is a field error before
        the run trains, not at its first step."""
        if isinstance(self.verifier, PythonVerifier):
            try:
                self.verifier.start()
            except ValueError as exc:
                raise FieldError([("task.reward_function", str(exc))]) from None

    def close(self) -> None:
        if isinstance(self.verifier, PythonVerifier):
            self.verifier.close()

    def reward_timeouts(self) -> int:
        return self.verifier.timeouts if isinstance(self.verifier, PythonVerifier) else 0

    def is_correct(self, problem: Problem, text: str) -> bool:
        return self.verifier.is_correct(text, problem.answer)

    def reward(self, problem: Problem, text: str) -> float:
        return self.verifier.reward(text, problem.answer, self.cfg.format_reward)

    def score(self, problems: Sequence[Problem], texts: Sequence[str]) -> list[tuple[float, bool]]:
        golds = [p.answer for p in problems]
        try:
            return self.verifier.score(texts, golds, self.cfg.format_reward)
        except RewardFunctionError as exc:
            raise FieldError([("task.reward_function", str(exc))]) from None

    # ----------------------------------------------------------- lengths
    def _measure(self) -> tuple[int, int]:
        """Longest prompt (BOS included) and target (EOS included), in the current tokens."""
        key = self.tokenizer
        if key not in self._lengths:
            problems = list(self.train_table.problems)
            if self.eval_table is not None:
                problems += self.eval_table.problems
            tok = self.tokenizer
            self._lengths[key] = (
                max(len(prompt_ids(tok, p)) for p in problems),
                max(len(tok.encode(p.target, bos=False, eos=True)) for p in problems),
            )
        return self._lengths[key]

    @property
    def max_prompt_len(self) -> int:
        return self._measure()[0]

    @property
    def max_target_len(self) -> int:
        return self._measure()[1]

    def lengths_known(self, cfg: ExperimentConfig) -> bool:
        """Bytes overcount a checkpoint's tokens: lengths are checked once its
        tokenizer is installed (``install_checkpoint_tokenizer``), not before."""
        return cfg.model.source == "builtin" or not isinstance(self.tokenizer, ByteTokenizer)
