"""Build the configured task and check a config's lengths against it."""

from __future__ import annotations

from trainer.config import ExperimentConfig, TaskConfig
from trainer.tasks.arithmetic import ArithmeticTask
from trainer.tasks.base import Task
from trainer.tasks.sort import SortTask
from trainer.tasks.text import TextTask

TASKS: dict[str, type[Task]] = {"arithmetic": ArithmeticTask, "sort": SortTask, "text": TextTask}


def make_task(cfg: TaskConfig) -> Task:
    """The task named by ``cfg.name``."""
    return TASKS[cfg.name](cfg)


def check_lengths(cfg: ExperimentConfig, task: Task | None = None) -> list[tuple[str, str]]:
    """Problems with a config's sequence lengths, as (field path, message) pairs.

    * ``rollout.max_new_tokens`` must fit the longest supervised response
      (EOS included), else no sampled response can ever be complete.
    * The longest prompt (BOS included) plus ``max_new_tokens`` must fit in
      ``model.max_seq_len``.
    * A fixed ``model.vocab_size`` must cover the tokenizer.

    Empty list = the config is consistent. The CLI reports these like
    validation errors (exit code 2). A text task on an imported model is
    measured in the checkpoint's tokens, once its tokenizer is installed.
    """
    task = task or make_task(cfg.task)
    errors: list[tuple[str, str]] = []
    if not task.lengths_known(cfg):
        return errors
    task.tokens_known()  # lengths are final: prompts over max_prompt_tokens are dropped
    new_tokens = cfg.rollout.max_new_tokens
    if new_tokens < task.max_target_len:
        errors.append(
            (
                "rollout.max_new_tokens",
                f"{new_tokens} is too short: this task's longest response takes "
                f"{task.max_target_len} tokens with EOS; raise it to at least "
                f"{task.max_target_len} or shorten the task",
            )
        )
    needed = task.max_prompt_len + new_tokens
    if needed > cfg.model.max_seq_len:
        errors.append(
            (
                "model.max_seq_len",
                f"{cfg.model.max_seq_len} is too short: the longest prompt "
                f"({task.max_prompt_len} tokens with BOS) plus rollout.max_new_tokens "
                f"({new_tokens}) needs {needed}",
            )
        )
    vocab = cfg.model.vocab_size
    if vocab is not None and vocab < task.tokenizer.vocab_size:
        errors.append(
            (
                "model.vocab_size",
                f"{vocab} is smaller than the tokenizer's {task.tokenizer.vocab_size} tokens; "
                "leave it empty to take it from the tokenizer",
            )
        )
    return errors
