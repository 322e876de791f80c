"""Write trainer/task_data/word_problems.jsonl: generated word problems, GSM8K format.

    python scripts/make_word_problems.py            # rewrites the shipped file
    python scripts/make_word_problems.py --check    # exit 1 when the file is stale

Each line is ``{"question": ..., "answer": "<working> #### <number>"}``, the
layout of GSM8K (the working, then ``####`` and the final number), so the
text task's numeric verifier and the warm start read it like GSM8K. The
problems are one- and two-step stories over small whole numbers, drawn from a
fixed seed: the same file on every machine, no download.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "trainer" / "task_data" / "word_problems.jsonl"
SEED = 20260
COUNT = 400

NAMES = ["Ana", "Ben", "Carla", "Dev", "Ema", "Finn", "Gita", "Hugo", "Ines", "Jon", "Kai", "Lea"]
THINGS = ["apples", "books", "coins", "marbles", "pencils", "shells", "stamps", "stickers"]

Problem = tuple[str, str, int]  # question, working, answer


def _add(r: random.Random) -> Problem:
    name, thing = r.choice(NAMES), r.choice(THINGS)
    a, b = r.randint(2, 60), r.randint(2, 40)
    q = f"{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have now?"
    return q, f"{a} + {b} = {a + b}", a + b


def _sub(r: random.Random) -> Problem:
    name, thing = r.choice(NAMES), r.choice(THINGS)
    a = r.randint(10, 90)
    b = r.randint(1, a - 1)
    q = f"{name} had {a} {thing} and gave away {b}. How many {thing} are left?"
    return q, f"{a} - {b} = {a - b}", a - b


def _mul(r: random.Random) -> Problem:
    name, thing = r.choice(NAMES), r.choice(THINGS)
    a, b = r.randint(2, 9), r.randint(2, 12)
    q = f"{name} fills {a} boxes with {b} {thing} each. How many {thing} is that in all?"
    return q, f"{a} * {b} = {a * b}", a * b


def _div(r: random.Random) -> Problem:
    name, thing = r.choice(NAMES), r.choice(THINGS)
    share, kids = r.randint(2, 12), r.randint(2, 8)
    total = share * kids
    q = f"{name} shares {total} {thing} equally among {kids} friends. How many does each get?"
    return q, f"{total} / {kids} = {share}", share


def _two_step(r: random.Random) -> Problem:
    name, thing = r.choice(NAMES), r.choice(THINGS)
    packs, per, lost = r.randint(2, 6), r.randint(3, 10), r.randint(1, 9)
    total = packs * per
    q = (
        f"{name} buys {packs} packs of {per} {thing} and then loses {lost}. "
        f"How many {thing} does {name} have?"
    )
    return q, f"{packs} * {per} = {total}\n{total} - {lost} = {total - lost}", total - lost


KINDS: list[Callable[[random.Random], Problem]] = [_add, _sub, _mul, _div, _two_step]


def generate(count: int = COUNT, seed: int = SEED) -> list[dict[str, str]]:
    """``count`` distinct problems, the same for a given seed."""
    rng = random.Random(seed)
    rows, seen = [], set()
    while len(rows) < count:
        question, working, answer = rng.choice(KINDS)(rng)
        if question in seen:
            continue
        seen.add(question)
        rows.append({"question": question, "answer": f"{working}\n#### {answer}"})
    return rows


def render(rows: list[dict[str, str]]) -> str:
    return "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when the file is stale")
    args = parser.parse_args(argv)
    text = render(generate())
    if args.check:
        current = OUT.read_text() if OUT.exists() else ""
        if current != text:
            print(f"{OUT} is stale; run python scripts/make_word_problems.py", file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {COUNT} problems to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
