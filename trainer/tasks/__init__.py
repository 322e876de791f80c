"""Verifiable tasks: a character tokenizer, problems, rewards, held-out sets.

    task = make_task(cfg.task)
    problems = task.sample(16, random.Random(seed))     # training draws
    task.eval_set()                                      # fixed, disjoint held-out set
    task.reward(problem, response_text)                  # 1 / format_reward / 0

Formats: ``arithmetic.py``, ``sort.py`` and file-backed ``text.py`` (verifiers: ``verifiers.py``); held-out split: ``holdout.py``.
"""

from trainer.tasks.arithmetic import ArithmeticTask
from trainer.tasks.base import Problem, Task
from trainer.tasks.factory import check_lengths, make_task
from trainer.tasks.holdout import HELD_OUT_SHARE
from trainer.tasks.sort import SortTask
from trainer.tasks.text import TextTask
from trainer.tasks.tokenizer import CharTokenizer

__all__ = [
    "HELD_OUT_SHARE",
    "ArithmeticTask",
    "CharTokenizer",
    "Problem",
    "SortTask",
    "Task",
    "TextTask",
    "check_lengths",
    "make_task",
]
