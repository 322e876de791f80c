"""Verifiers of text tasks: how a response's final answer is read and scored.

A verifier has two sides:

* ``gold(raw)`` turns a dataset row's answer field into the canonical answer,
  raising ``BadRow`` when it cannot (such rows are skipped and counted, never
  a crash);
* ``reward(response, gold, format_reward)``: 1 for a correct final answer,
  ``format_reward`` for a final answer that parses but is wrong, 0 for a
  response with no parsable final answer (the RLVR convention of
  ``trainer.tasks.base``).

Kinds (``task.verifier``):

* ``numeric`` - the final answer is the text after the last ``####`` (GSM8K)
  or, failing that, inside the last ``\\boxed{...}`` (MATH); it is correct
  when ``|pred - gold| <= tol * max(1, |gold|)``. Numbers may carry thousands
  commas, ``$``, ``%``, a sign, decimals, or be a fraction ``a/b`` or
  ``\\frac{a}{b}``; a final answer with words after its number ("42 apples")
  is read as its leading number.
* ``exact`` - the same final-answer extraction (whole response when neither
  marker is present), compared after stripping whitespace.
* ``choice`` - multiple choice: the last standalone choice label (``A``,
  ``(B)``, ...) of the final answer; the gold answer is a label or a 0-based
  index into the labels.
* ``python`` - ``module.path:function(response, answer) -> float`` named by
  import path; its value (clamped to [0, 1]) is the reward and 1 is correct.
  It runs in its own process with a time bound per call
  (``trainer.tasks.reward_process``); which functions a lab's runs may name
  is ``trainer.reward_functions``' rule.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from fractions import Fraction

from trainer.reward_functions import parse_reward_path
from trainer.tasks.reward_process import RewardProcess

GSM8K_MARKER = "####"
_BOXED = "\\boxed{"
_FRAC = re.compile(r"^\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}$")
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


class BadRow(ValueError):
    """A dataset row that cannot be used; the message says why (it is counted by reason)."""


# --------------------------------------------------------------------------- extraction
def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (nested braces balanced), or None."""
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    depth, i = 1, start + len(_BOXED)
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def final_answer(text: str, whole_text_fallback: bool = False) -> str | None:
    """The text after the last ``####``, else the last ``\\boxed{}`` content, stripped.

    None when neither marker is present (unless ``whole_text_fallback``), or
    the marked answer is empty.
    """
    if GSM8K_MARKER in text:
        answer = text.rsplit(GSM8K_MARKER, 1)[1]
    else:
        answer = last_boxed(text)
        if answer is None:
            answer = text if whole_text_fallback else None
    if answer is None:
        return None
    answer = answer.strip()
    return answer or None


def parse_number(text: str) -> float | None:
    """The number ``text`` spells, or None. ``"1,234"`` -> 1234.0, ``"$5"`` -> 5.0,
    ``"50%"`` -> 50.0, ``"3/4"`` and ``"\\frac{3}{4}"`` -> 0.75, ``"7."`` -> 7.0."""
    cleaned = text.strip().rstrip(".").replace(",", "").replace("$", "").replace(" ", "")
    cleaned = cleaned.removesuffix("%").removesuffix("\\%")
    match = _FRAC.match(cleaned)
    if match:
        cleaned = f"{match.group(1)}/{match.group(2)}"
    if cleaned.count("/") == 1:
        num, den = cleaned.split("/")
        try:
            value = Fraction(num) / Fraction(den)
        except (ValueError, ZeroDivisionError):
            return None
        return float(value)
    if not _NUMBER.match(cleaned):
        return None
    value = float(cleaned)
    return value if math.isfinite(value) else None


# --------------------------------------------------------------------------- verifiers
class Verifier:
    """Base: extraction + comparison; subclasses override ``gold``, ``extract``, ``matches``."""

    def gold(self, raw: object) -> str:
        """The canonical answer of a row's answer field; BadRow when unusable."""
        text = _as_text(raw)
        answer = final_answer(text, whole_text_fallback=True)
        if answer is None:
            raise BadRow("empty answer")
        return answer

    def extract(self, response: str) -> str | None:
        """The final answer of a response, or None when it has none (malformed)."""
        return final_answer(response)

    def matches(self, extracted: str, gold: str) -> bool:
        return extracted == gold

    def is_correct(self, response: str, gold: str) -> bool:
        extracted = self.extract(response)
        return extracted is not None and self.matches(extracted, gold)

    def reward(self, response: str, gold: str, format_reward: float) -> float:
        extracted = self.extract(response)
        if extracted is None:
            return 0.0
        return 1.0 if self.matches(extracted, gold) else float(format_reward)

    def score(
        self, responses: Sequence[str], golds: Sequence[str], format_reward: float
    ) -> list[tuple[float, bool]]:
        """(reward, correct) of each response against its gold answer: one batch."""
        return [
            (self.reward(r, g, format_reward), self.is_correct(r, g))
            for r, g in zip(responses, golds, strict=True)
        ]

    def target(self, raw: object, gold: str) -> str:
        """The warm start's supervised response: the answer field when this verifier
        reads it back to the gold answer, else the gold answer in the form it reads."""
        text = raw if isinstance(raw, str) else str(raw)
        return text if self.is_correct(text, gold) else gold


class NumericVerifier(Verifier):
    def __init__(self, tolerance: float) -> None:
        self.tolerance = tolerance

    def gold(self, raw: object) -> str:
        if isinstance(raw, int | float) and not isinstance(raw, bool):
            if not math.isfinite(raw):
                raise BadRow("answer is not a finite number")
            # 7 and 7.0 are written "7": the warm start teaches "#### 7", not "#### 7.0"
            return str(int(raw)) if float(raw).is_integer() else repr(float(raw))
        answer = final_answer(_as_text(raw), whole_text_fallback=True)
        if answer is None or parse_number(answer) is None:
            raise BadRow("answer is not a number")
        return answer

    def target(self, raw: object, gold: str) -> str:
        text = raw if isinstance(raw, str) else str(raw)
        return text if self.is_correct(text, gold) else f"{GSM8K_MARKER} {gold}"

    def matches(self, extracted: str, gold: str) -> bool:
        pred, want = parse_number(extracted), parse_number(gold)
        if pred is None and extracted.split():  # "#### 42 apples": the leading number
            pred = parse_number(extracted.split()[0])
        if pred is None or want is None:
            return False
        return abs(pred - want) <= self.tolerance * max(1.0, abs(want))


class ExactVerifier(Verifier):
    def extract(self, response: str) -> str | None:
        return final_answer(response, whole_text_fallback=True)


class ChoiceVerifier(Verifier):
    def __init__(self, labels: str) -> None:
        self.labels = labels
        self._pattern = re.compile(rf"(?<![A-Za-z])\(?([{re.escape(labels)}])\)?(?![A-Za-z])")

    def gold(self, raw: object) -> str:
        if isinstance(raw, int) and not isinstance(raw, bool):
            if not 0 <= raw < len(self.labels):
                raise BadRow("answer index is outside the choice labels")
            return self.labels[raw]
        text = _as_text(raw).strip().strip("()").upper()
        if len(text) != 1 or text not in self.labels:
            raise BadRow("answer is not a choice label")
        return text

    def extract(self, response: str) -> str | None:
        answer = final_answer(response, whole_text_fallback=True)
        if answer is None:
            return None
        found = self._pattern.findall(answer)
        return found[-1] if found else None


class PythonVerifier(Verifier):
    """A custom reward ``fn(response, answer) -> float`` (1 = correct), named by
    import path and run only in its own process (``trainer.tasks.reward_process``),
    started on first use: building a task (config validation, the web server)
    never imports or calls it."""

    def __init__(self, function: str, timeout_s: float = 10.0) -> None:
        parse_reward_path(function)  # syntax now; whether it may run and loads: start()
        self.function = function
        self.timeout_s = timeout_s
        self._process: RewardProcess | None = None

    def start(self) -> None:
        """Start the function's process (ValueError: not offered, cannot load)."""
        if self._process is None:
            self._process = RewardProcess(self.function, self.timeout_s)
        self._process.start()

    def close(self) -> None:
        if self._process is not None:
            self._process.close()

    @property
    def timeouts(self) -> int:
        """Calls that ran over ``timeout_s`` (each scored 0)."""
        return self._process.timeouts if self._process is not None else 0

    def gold(self, raw: object) -> str:
        return _as_text(raw)

    def target(self, raw: object, gold: str) -> str:
        return gold  # the answer field as is; reading it back would call the function

    def score(
        self, responses: Sequence[str], golds: Sequence[str], format_reward: float
    ) -> list[tuple[float, bool]]:
        self.start()
        assert self._process is not None
        values = self._process.score(list(zip(responses, golds, strict=True)))
        out = []
        for value in values:  # None: over the time bound, scored 0
            reward = (
                min(1.0, max(0.0, value)) if value is not None and math.isfinite(value) else 0.0
            )
            out.append((reward, reward >= 1.0))
        return out

    def reward(self, response: str, gold: str, format_reward: float) -> float:
        return self.score([response], [gold], format_reward)[0][0]

    def is_correct(self, response: str, gold: str) -> bool:
        return self.score([response], [gold], 0.0)[0][1]


def make_verifier(
    kind: str,
    tolerance: float = 1e-6,
    labels: str = "ABCD",
    function: str | None = None,
    timeout_s: float = 10.0,
) -> Verifier:
    """The verifier of ``task.verifier`` (see the module docstring). Nothing user
    supplied is imported here: the python verifier loads its function when it
    first scores (or on ``start()``), in its own process."""
    if kind == "numeric":
        return NumericVerifier(tolerance)
    if kind == "exact":
        return ExactVerifier()
    if kind == "choice":
        return ChoiceVerifier(labels)
    if kind == "python":
        if not function:
            raise ValueError("the python verifier needs a reward function import path")
        return PythonVerifier(function, timeout_s)
    raise ValueError(f"unknown verifier {kind!r}")


def _as_text(raw: object) -> str:
    if raw is None:
        raise BadRow("answer is missing")
    if isinstance(raw, str):
        return raw
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        return str(raw)
    raise BadRow("answer is not text")
