"""``task``: one model per task kind, picked by ``task.name`` (arithmetic | sort | text)."""

from __future__ import annotations

import string
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from trainer.config.section import Section
from trainer.reward_functions import parse_reward_path

# A prompt longer than this cannot fit any model.max_seq_len (<= 32768 tokens at about
# 4 characters a token); one 50 MB line once grew a run past 7 GB before it was killed.
DEFAULT_MAX_PROMPT_CHARS = 131_072


class TaskBase(Section):
    """Fields every task kind shares; ``name`` picks the kind (a tagged union)."""

    format_reward: float = Field(
        0.0,
        ge=0.0,
        le=0.5,
        description="Reward for a well-formed but wrong answer; 0 = strictly verifiable.",
    )
    eval_size: int = Field(
        256,
        ge=8,
        le=100000,
        description="Held-out evaluation problems; capped at the held-out 10% of a small "
        "problem space (e.g. 10 for 1-digit addition).",
    )
    eval_seed: int = Field(
        12345, ge=0, description="Seed of the held-out set (kept apart from run.seed)."
    )


class ArithmeticTaskConfig(TaskBase):
    name: Literal["arithmetic"] = Field(
        "arithmetic", description="arithmetic: multi-digit +, -, *."
    )
    operations: list[Literal["add", "sub", "mul"]] = Field(
        ["add"],  # pydantic copies a mutable default per instance
        min_length=1,
        description="Arithmetic operations drawn uniformly per problem.",
    )
    min_digits: int = Field(1, ge=1, le=12, description="Fewest digits per operand.")
    max_digits: int = Field(2, ge=1, le=12, description="Most digits per operand.")
    scratchpad: bool = Field(
        False,
        description="Ask for a digit-by-digit scratchpad before the answer (20+ token "
        "responses; the training-inference gap grows over a sequence's tokens).",
    )

    @model_validator(mode="after")
    def _check_digits(self) -> ArithmeticTaskConfig:
        if self.min_digits > self.max_digits:
            raise ValueError("min_digits: min_digits must be <= max_digits; raise max_digits")
        return self


class SortTaskConfig(TaskBase):
    name: Literal["sort"] = Field("sort", description="sort: sort a list of numbers.")
    min_len: int = Field(3, ge=2, le=32, description="Shortest list to sort.")
    max_len: int = Field(6, ge=2, le=32, description="Longest list to sort.")
    max_value: int = Field(99, ge=9, le=9999, description="Largest number in a list.")

    @model_validator(mode="after")
    def _check_lengths(self) -> SortTaskConfig:
        if self.min_len > self.max_len:
            raise ValueError("min_len: min_len must be <= max_len; raise max_len")
        return self


class TextTaskConfig(TaskBase):
    """A task read from a local JSONL/Parquet file (``trainer.tasks.text``, docs/models.md)."""

    name: Literal["text"] = Field(
        "text", description="text: prompts and verifiable answers from a local data file."
    )
    data_file: str = Field(
        "word_problems.jsonl",
        min_length=1,
        description="Absolute path of a .jsonl/.json/.parquet file (read with the datasets "
        "library), or the name of a file shipped in trainer/task_data (word_problems.jsonl).",
    )
    eval_file: str | None = Field(
        None,
        description="A separate held-out file (e.g. GSM8K's test.jsonl), same fields; empty = "
        "hold out about 10% of data_file's prompts by hash (as the built-in tasks do).",
    )
    prompt_field: str = Field("question", min_length=1, description="Row field of the prompt.")
    messages_field: str | None = Field(
        None,
        min_length=1,
        description='Row field holding the prompt as a conversation, [{"role": "system" | '
        '"user" | "assistant", "content": text}, ...] ending with a user turn (a '
        "system prompt, few-shot turns), rendered by the checkpoint's chat template; "
        "needs model.chat_template; prompt_field and prompt_template are then unused.",
    )
    prompt_template: str | None = Field(
        None,
        description="Python format string over the row's fields, e.g. 'Q: {question}\\nA:'; "
        "empty = the prompt_field as is.",
    )
    answer_field: str = Field(
        "answer",
        min_length=1,
        description="Row field of the answer; also the supervised warm-start response "
        "(a GSM8K answer: working, then '#### 42').",
    )
    verifier: Literal["numeric", "exact", "choice", "python"] = Field(
        "numeric",
        description="numeric: '####' (GSM8K) or \\boxed{} (MATH) answer within tolerance; "
        "exact: string match; choice: multiple-choice label; python: reward_function.",
    )
    tolerance: float = Field(
        1e-6,
        ge=0.0,
        le=1.0,
        description="numeric: correct when |pred - gold| <= tolerance * max(1, |gold|).",
    )
    choice_labels: str = Field(
        "ABCD",
        min_length=2,
        max_length=26,
        pattern="^[A-Z]+$",
        description="choice: the option labels, in order (a 0-based integer answer picks one).",
    )
    reward_function: str | None = Field(
        None,
        max_length=300,
        description="python: import path 'package.module:function' of "
        "fn(response: str, answer: str) -> float in [0, 1] (1 = correct); on the lab's "
        "workers only a function its administrator offers (LAB_REWARD_MODULES). It runs "
        "in its own process, never in the web server.",
    )
    reward_timeout_s: float = Field(
        10.0,
        gt=0.0,
        le=600.0,
        description="python: seconds one reward call may take; a call over it scores 0 "
        "(counted in the log) and the function's process is restarted.",
    )
    max_prompt_chars: int = Field(
        DEFAULT_MAX_PROMPT_CHARS,
        ge=1,
        le=1_000_000,
        description="Rows whose prompt is longer (in characters; a conversation's turns "
        "together) are skipped and counted, as verl's filter_overlong_prompts. The default, "
        "131072, is more than any model.max_seq_len (at most 32768 tokens) holds at about 4 "
        "characters a token; empty = the default.",
    )

    max_prompt_tokens: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="Rows whose prompt takes more tokens (in the tokens the run speaks: the "
        "checkpoint's tokenizer, chat template and BOS included; bytes on the builtin model) "
        "are skipped and counted, as verl's filter_overlong_prompts; empty = keep every row.",
    )

    @field_validator("max_prompt_chars", mode="before")
    @classmethod
    def _default_bound(cls, value: object) -> object:
        """Empty (or a stored config's null, from before the bound) = the default:
        every prompt has a bound."""
        return DEFAULT_MAX_PROMPT_CHARS if value is None else value

    @field_validator("prompt_template")
    @classmethod
    def _plain_fields_only(cls, value: str | None) -> str | None:
        """Only plain ``{field}`` replacements: a format spec (``{q:>10000000}``), a
        conversion or an attribute/index lookup would let a template cost memory
        and time unrelated to the data (or reach into objects)."""
        if value is None:
            return value
        try:
            parts = list(string.Formatter().parse(value))
        except ValueError as exc:
            raise ValueError(f"not a format string: {exc}") from None
        for _, name, spec, conversion in parts:
            if name is None:
                continue
            if spec or conversion:
                raise ValueError(
                    f"{{{name}...}}: format specs and conversions are not allowed; "
                    "use plain {field} names"
                )
            if not name or not name.isidentifier():
                raise ValueError(f"{{{name}}}: use plain {{field}} names (no indexes, no dots)")
        return value

    @model_validator(mode="after")
    def _check_verifier(self) -> TextTaskConfig:
        if self.messages_field and self.prompt_template is not None:
            raise ValueError(
                "prompt_template: a conversation (messages_field) is rendered by the chat "
                "template; clear prompt_template or messages_field"
            )
        if self.verifier == "python" and not self.reward_function:
            raise ValueError(
                "reward_function: the python verifier needs an import path "
                "'package.module:function'"
            )
        if self.reward_function:
            try:
                parse_reward_path(self.reward_function)  # the name only: nothing is imported
            except ValueError as exc:
                raise ValueError(f"reward_function: {exc}") from None
        if self.reward_function and self.verifier != "python":
            raise ValueError(
                "reward_function: only used with verifier='python'; set the verifier or clear it"
            )
        return self


TaskConfig = Annotated[
    ArithmeticTaskConfig | SortTaskConfig | TextTaskConfig, Field(discriminator="name")
]
"""One model per task kind, chosen by ``task.name``."""
