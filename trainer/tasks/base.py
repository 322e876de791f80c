"""The verifiable-task interface shared by every task.

A task draws ``Problem`` s, scores a sampled response text, and owns a fixed
held-out evaluation set that training draws never touch (``holdout.py``).

Rewards (the RLVR convention): 1 for an exactly correct parsed answer,
``format_reward`` (config, default 0) for a response whose final answer parses
but is wrong, 0 for anything that does not parse.

The verifier reads ONLY the final answer: the text after the last ``|``
separator (tasks with a scratchpad require the separator), or the whole text
when there is none. The working before it is never checked, so a response is
correct iff its final answer equals ``Problem.answer`` exactly.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from trainer.config import ExperimentConfig, TaskBase
from trainer.tasks.holdout import ENUMERATE_LIMIT, HeldOutSplit
from trainer.tasks.tokenizer import CharTokenizer

SEPARATOR = "|"

# Unique evaluation problems are drawn by rejection; beyond this many draws per
# wanted problem the space is too small for the request (never hit in practice:
# small spaces take the enumeration path).
_MAX_DRAWS_PER_EVAL_PROBLEM = 1000


@dataclass(frozen=True)
class Problem:
    """One problem.

    prompt: the text after BOS that the policy conditions on, e.g. ``"37+58="``.
    answer: the canonical final answer, e.g. ``"95"``.
    target: the full supervised response (scratchpad included) for the warm
            start, e.g. ``"7+8+0=15,3+5+1=09|95"``; EOS follows it.
    messages: the whole conversation when the prompt is one (a text task's
            ``messages_field``): ``(role, content)`` pairs ending with the user
            turn whose content is ``prompt``; empty for a plain prompt.
    """

    prompt: str
    answer: str
    target: str
    messages: tuple[tuple[str, str], ...] = ()


def prompt_ids(tokenizer: Any, problem: Problem) -> list[int]:
    """The token ids a problem's prompt is encoded to: its conversation through the
    checkpoint's chat template when it has one, else its text after BOS."""
    # Only a checkpoint's tokenizer renders conversations (the config requires
    # model.chat_template for one); the bytes a text task counts before that
    # tokenizer is installed are never used as lengths (``lengths_known``).
    encode_conversation = getattr(tokenizer, "encode_conversation", None)
    if problem.messages and encode_conversation is not None:
        return encode_conversation(problem.messages)
    return tokenizer.encode(problem.prompt, bos=True)


def final_segment(text: str, require_separator: bool) -> str | None:
    """The text after the last ``|`` (the whole text if there is none and none is required)."""
    if SEPARATOR in text:
        return text.rsplit(SEPARATOR, 1)[1]
    return None if require_separator else text


class Task(ABC):
    """Base class: held-out split, sampling, evaluation set, rewards, lengths.

    A subclass describes its problem space with hashable *specs* (e.g.
    ``("add", 37, 58)``) and implements the abstract methods below.
    """

    def __init__(self, cfg: TaskBase, tokenizer: CharTokenizer | None = None) -> None:
        self.cfg = cfg
        self.tokenizer = tokenizer or CharTokenizer()

    # ----------------------------------------------------------- subclass hooks
    @abstractmethod
    def space_size(self) -> int:
        """Number of distinct problems (specs) the training distribution can produce."""

    @abstractmethod
    def all_specs(self) -> Iterable[Hashable]:
        """Every spec; only called when ``space_size() <= ENUMERATE_LIMIT``."""

    @abstractmethod
    def draw_spec(self, rng: random.Random) -> Hashable:
        """One spec from the training distribution (held-out ones included)."""

    @abstractmethod
    def prompt_of(self, spec: Hashable) -> str:
        """The prompt text, which identifies the problem (it is the held-out key)."""

    @abstractmethod
    def build(self, spec: Hashable) -> Problem:
        """The full problem (answer and supervised target) of a spec."""

    @abstractmethod
    def parse_answer(self, text: str) -> str | None:
        """The final answer of a response text, or None when it is malformed."""

    @abstractmethod
    def longest_specs(self) -> Iterable[Hashable]:
        """Specs that include the longest prompt and the longest target of the space."""

    # ----------------------------------------------------------- held-out split
    @property
    def enumerable(self) -> bool:
        return self.space_size() <= ENUMERATE_LIMIT

    @cached_property
    def split(self) -> HeldOutSplit:
        keys = (self.prompt_of(s) for s in self.all_specs()) if self.enumerable else None
        return HeldOutSplit(self.cfg.eval_seed, keys)

    def is_held_out(self, problem_or_prompt: Problem | str) -> bool:
        prompt = (
            problem_or_prompt.prompt
            if isinstance(problem_or_prompt, Problem)
            else problem_or_prompt
        )
        return self.split.is_held_out(prompt)

    # ----------------------------------------------------------- sampling
    def sample(self, n: int, rng: random.Random) -> list[Problem]:
        """``n`` i.i.d. training problems; held-out problems are rejected and redrawn."""
        problems = []
        while len(problems) < n:
            spec = self.draw_spec(rng)
            if not self.split.is_held_out(self.prompt_of(spec)):
                problems.append(self.build(spec))
        return problems

    def eval_set(self) -> list[Problem]:
        """The fixed held-out evaluation set: unique problems, same order every call.

        Deterministic in ``cfg.eval_seed``. Its size is ``cfg.eval_size``,
        capped at the number of held-out problems (``HELD_OUT_SHARE`` of a
        small space). Problems follow the training distribution (drawn with
        ``Random(eval_seed)``, rejecting non-held-out and repeated keys); when a
        small space's request exceeds half of its held-out problems, the whole
        held-out set is listed in a seeded order instead.
        """
        return list(self._eval_problems)

    @cached_property
    def _eval_problems(self) -> tuple[Problem, ...]:
        rng = random.Random(self.cfg.eval_seed)
        held_out_count = self.split.count
        wanted = self.cfg.eval_size
        if held_out_count is not None:
            wanted = min(wanted, held_out_count)
            if 2 * wanted > held_out_count:
                specs = [s for s in self.all_specs() if self.split.is_held_out(self.prompt_of(s))]
                rng.shuffle(specs)
                return tuple(self.build(s) for s in specs[:wanted])
        chosen: dict[str, Hashable] = {}
        for _ in range(_MAX_DRAWS_PER_EVAL_PROBLEM * wanted):
            spec = self.draw_spec(rng)
            prompt = self.prompt_of(spec)
            if prompt not in chosen and self.split.is_held_out(prompt):
                chosen[prompt] = spec
                if len(chosen) == wanted:
                    break
        else:
            raise RuntimeError(
                f"could not draw {wanted} distinct held-out problems; lower task.eval_size"
            )
        return tuple(self.build(s) for s in chosen.values())

    # ----------------------------------------------------------- rewards
    def start(self) -> None:
        """Ready the task's scoring before a run trains (a custom reward function's
        process); FieldError when it cannot score. Nothing to do for built-in tasks."""
        return None

    def close(self) -> None:
        """End what ``start`` started (idempotent)."""
        return None

    def reward_timeouts(self) -> int:
        """Reward calls that ran over their time bound so far (each scored 0)."""
        return 0

    def score(self, problems: Sequence[Problem], texts: Sequence[str]) -> list[tuple[float, bool]]:
        """(reward, correct) of each response ``texts[i]`` to ``problems[i]``, as one
        batch (a custom reward function scores it in one round trip)."""
        return [
            (self.reward(p, t), self.is_correct(p, t)) for p, t in zip(problems, texts, strict=True)
        ]

    def is_correct(self, problem: Problem, text: str) -> bool:
        """True iff the parsed final answer of the response ``text`` equals the answer."""
        return self.parse_answer(text) == problem.answer

    def reward(self, problem: Problem, text: str) -> float:
        """1 if correct, ``cfg.format_reward`` if well-formed but wrong, else 0."""
        parsed = self.parse_answer(text)
        if parsed is None:
            return 0.0
        return 1.0 if parsed == problem.answer else float(self.cfg.format_reward)

    # ----------------------------------------------------------- reporting
    def data_report(self) -> dict:
        """What the task read (file tasks: rows and skipped rows); empty for generated tasks."""
        return {}

    # ----------------------------------------------------------- lengths
    def tokens_known(self) -> None:
        """The tokenizer is the one the run speaks (called once it is installed, or
        when validation knows it is final); a task whose rows depend on token
        counts rebuilds them here. Generated tasks have none."""
        return None

    def lengths_known(self, cfg: ExperimentConfig) -> bool:
        """Whether ``max_prompt_len`` / ``max_target_len`` are final for ``cfg``'s model."""
        return True

    @cached_property
    def _longest(self) -> tuple[int, int]:
        problems = [self.build(s) for s in self.longest_specs()]
        prompt = max(len(prompt_ids(self.tokenizer, p)) for p in problems)
        target = max(len(self.tokenizer.encode(p.target, bos=False, eos=True)) for p in problems)
        return prompt, target

    @property
    def max_prompt_len(self) -> int:
        """Longest prompt in tokens, BOS included."""
        return self._longest[0]

    @property
    def max_target_len(self) -> int:
        """Longest supervised response in tokens, EOS included."""
        return self._longest[1]
