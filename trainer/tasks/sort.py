"""Sorting a list of numbers: a task structurally unlike arithmetic.

Arithmetic answers are computed column by column; here the response copies
every prompt number once, in a new order, so the policy must attend across the
whole prompt for every token.

Each problem picks a length uniformly from ``min_len..max_len`` and
each number uniformly from ``0..max_value`` (repeats allowed: they stay
repeated in the answer).

Prompt ``"sort:{n_1},...,{n_L}="`` and response (= answer) the numbers in
ascending order, comma-separated, without spaces::

    sort:43,7,91=   ->  7,43,91

Responses grow with the list: 8 two-digit numbers give 23 tokens (+ EOS). The
verifier reads the text after the last ``|`` if any (the whole text otherwise)
and accepts only digits separated by single commas as well-formed.
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Iterator

from trainer.config import SortTaskConfig
from trainer.tasks.base import Problem, Task, final_segment
from trainer.tasks.tokenizer import CharTokenizer

SortSpec = tuple[int, ...]

PREFIX = "sort:"
_NUMBER_LIST = re.compile(r"[0-9]+(,[0-9]+)*")


class SortTask(Task):
    """Sort a list of non-negative integers ascending; see the module docstring."""

    def __init__(self, cfg: SortTaskConfig, tokenizer: CharTokenizer | None = None) -> None:
        super().__init__(cfg, tokenizer)
        self.lengths = range(cfg.min_len, cfg.max_len + 1)
        self.values = range(cfg.max_value + 1)

    def space_size(self) -> int:
        return sum(len(self.values) ** n for n in self.lengths)

    def all_specs(self) -> Iterator[SortSpec]:
        for n in self.lengths:
            yield from itertools.product(self.values, repeat=n)

    def draw_spec(self, rng: random.Random) -> SortSpec:
        n = rng.choice(self.lengths)
        return tuple(rng.randrange(len(self.values)) for _ in range(n))

    def prompt_of(self, spec: SortSpec) -> str:
        return PREFIX + ",".join(map(str, spec)) + "="

    def build(self, spec: SortSpec) -> Problem:
        answer = ",".join(map(str, sorted(spec)))
        return Problem(prompt=self.prompt_of(spec), answer=answer, target=answer)

    def parse_answer(self, text: str) -> str | None:
        """The comma-separated number list after the last ``|`` (or the whole text), else None."""
        segment = final_segment(text, require_separator=False)
        if segment is None or not _NUMBER_LIST.fullmatch(segment):
            return None
        return segment

    def longest_specs(self) -> Iterator[SortSpec]:
        # The longest list of the widest numbers is the longest prompt and answer.
        yield (self.values[-1],) * self.lengths[-1]
