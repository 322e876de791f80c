"""Multi-digit arithmetic: addition, subtraction, multiplication.

Problems. Each problem picks an operation uniformly from ``cfg.operations``,
then each operand's digit count uniformly from ``min_digits..max_digits`` and
its value uniformly among the numbers with that many digits (1 digit means
0-9). Subtraction orders its operands so that the result is never negative
(``a - b`` with ``a >= b``): every answer is a plain digit string and the
borrow scratchpad needs no sign handling.

Prompt ``"{a}{op}{b}="``, e.g. ``"37+58="``. The final answer is the canonical
decimal result (no leading zeros): ``"95"``.

Without a scratchpad the response is the answer alone: ``"95"``.

With ``cfg.scratchpad`` the response is a digit-by-digit working, then ``|``
and the answer. The verifier reads only the text after the last ``|`` (and
requires the ``|``); the working is supervised in the warm start, never checked.

* Addition, one record per column from the least significant digit (the
  shorter operand padded with zeros): ``{a_i}+{b_i}+{carry_in}={carry_out}{digit}``
  (the two digits after ``=`` are the column sum)::

      37+58=   ->  7+8+0=15,3+5+1=09|95

  At most ``10 * D + 1`` tokens (EOS not counted) for D-digit operands: 21
  for 2 digits, 31 for 3 digits.

* Subtraction, the same layout with borrows:
  ``{a_i}-{b_i}-{borrow_in}={borrow_out}{digit}`` where
  ``a_i - b_i - borrow_in = digit - 10 * borrow_out``::

      305-127=  ->  5-7-0=18,0-2-1=17,3-1-1=01|178

* Multiplication, one partial product per digit of ``b`` from the least
  significant, ``{a}*{b_i * 10^i}={a * b_i * 10^i}``; the answer is their sum::

      12*34=   ->  12*4=48,12*30=360|408

  At most ``3 * D^2 + 6 * D`` tokens for two D-digit operands (72 for D = 4).
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator

from trainer.config import ArithmeticTaskConfig
from trainer.tasks.base import Problem, Task, final_segment
from trainer.tasks.tokenizer import CharTokenizer

ArithmeticSpec = tuple[str, int, int]  # (operation, a, b)

SYMBOLS = {"add": "+", "sub": "-", "mul": "*"}
_NUMBER = re.compile(r"-?[0-9]+")


# --------------------------------------------------------------------------- scratchpads
def _digits_lsb_first(n: int, width: int) -> list[int]:
    """The decimal digits of ``n``, least significant first, zero-padded to ``width``."""
    return [int(ch) for ch in reversed(str(n).zfill(width))]


def add_scratchpad(a: int, b: int) -> str:
    """Column sums with carries, then ``|`` and ``a + b`` (see the module docstring)."""
    width = max(len(str(a)), len(str(b)))
    records, carry = [], 0
    for x, y in zip(_digits_lsb_first(a, width), _digits_lsb_first(b, width), strict=True):
        total = x + y + carry
        records.append(f"{x}+{y}+{carry}={total:02d}")
        carry = total // 10
    return ",".join(records) + f"|{a + b}"


def sub_scratchpad(a: int, b: int) -> str:
    """Column differences with borrows, then ``|`` and ``a - b``; needs ``a >= b``."""
    if a < b:
        raise ValueError(f"sub_scratchpad needs a >= b, got {a} - {b}")
    width = len(str(a))
    records, borrow = [], 0
    for x, y in zip(_digits_lsb_first(a, width), _digits_lsb_first(b, width), strict=True):
        diff = x - y - borrow
        borrow_out = 1 if diff < 0 else 0
        records.append(f"{x}-{y}-{borrow}={borrow_out}{diff + 10 * borrow_out}")
        borrow = borrow_out
    return ",".join(records) + f"|{a - b}"


def mul_scratchpad(a: int, b: int) -> str:
    """Partial products of ``a`` by each shifted digit of ``b``, then ``|`` and ``a * b``."""
    records = []
    for i, digit in enumerate(_digits_lsb_first(b, len(str(b)))):
        shifted = digit * 10**i
        records.append(f"{a}*{shifted}={a * shifted}")
    return ",".join(records) + f"|{a * b}"


SCRATCHPADS = {"add": add_scratchpad, "sub": sub_scratchpad, "mul": mul_scratchpad}
RESULTS = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b}


# --------------------------------------------------------------------------- task
def digit_range(digits: int) -> range:
    """Numbers with exactly ``digits`` digits (1 digit: 0-9)."""
    return range(0 if digits == 1 else 10 ** (digits - 1), 10**digits)


class ArithmeticTask(Task):
    """``a op b`` with op in cfg.operations; see the module docstring for formats."""

    def __init__(self, cfg: ArithmeticTaskConfig, tokenizer: CharTokenizer | None = None) -> None:
        super().__init__(cfg, tokenizer)
        self.operations = list(dict.fromkeys(cfg.operations))  # drop repeats, keep order
        self.digit_counts = list(range(cfg.min_digits, cfg.max_digits + 1))
        # All operand values: digit ranges min..max are contiguous.
        self.operand_values = range(
            digit_range(cfg.min_digits).start, digit_range(cfg.max_digits).stop
        )

    def space_size(self) -> int:
        n = len(self.operand_values)
        return sum(n * (n + 1) // 2 if op == "sub" else n * n for op in self.operations)

    def all_specs(self) -> Iterator[ArithmeticSpec]:
        for op in self.operations:
            for a in self.operand_values:
                for b in self.operand_values:
                    if op != "sub" or a >= b:
                        yield (op, a, b)

    def _operand(self, rng: random.Random) -> int:
        r = digit_range(rng.choice(self.digit_counts))
        return rng.randrange(r.start, r.stop)

    def draw_spec(self, rng: random.Random) -> ArithmeticSpec:
        op = rng.choice(self.operations)
        a, b = self._operand(rng), self._operand(rng)
        if op == "sub" and a < b:
            a, b = b, a
        return (op, a, b)

    def prompt_of(self, spec: ArithmeticSpec) -> str:
        op, a, b = spec
        return f"{a}{SYMBOLS[op]}{b}="

    def build(self, spec: ArithmeticSpec) -> Problem:
        op, a, b = spec
        answer = str(RESULTS[op](a, b))
        target = SCRATCHPADS[op](a, b) if self.cfg.scratchpad else answer
        return Problem(prompt=self.prompt_of(spec), answer=answer, target=target)

    def parse_answer(self, text: str) -> str | None:
        """The number after the last ``|`` (the whole text without a scratchpad), else None."""
        segment = final_segment(text, require_separator=self.cfg.scratchpad)
        if segment is None or not _NUMBER.fullmatch(segment):
            return None
        return segment

    def longest_specs(self) -> Iterator[ArithmeticSpec]:
        # Lengths depend only on digit counts and, for the scratchpads, on the
        # digits of the results: the smallest and largest operand of every digit
        # count cover the longest prompt, answer and working (tested against a
        # brute force over small spaces).
        extremes = []
        for d in self.digit_counts:
            r = digit_range(d)
            extremes += [r.start, r.stop - 1]
        for op in self.operations:
            for a in extremes:
                for b in extremes:
                    if op != "sub" or a >= b:
                        yield (op, a, b)
