"""Character tokenizer shared by every task.

One fixed vocabulary covers all tasks, so ``vocab_size`` (and with it the
model's embedding shape) does not depend on which task a run trains on:

    id 0        PAD   (never attended to; left and right padding)
    id 1        BOS   (starts every prompt)
    id 2        EOS   (ends every response)
    id 3..      one id per character of CHARACTERS, in that order

Example::

    >>> tok = CharTokenizer()
    >>> tok.encode("37+58=")          # BOS, '3', '7', '+', '5', '8', '='
    [1, 6, 10, 13, 8, 11, 16]
    >>> tok.decode([1, 6, 10, 13, 8, 11, 16, 2, 0])
    '37+58='
"""

from __future__ import annotations

from collections.abc import Iterable

# Digits, the operators and separators the task formats use, a few spare
# punctuation marks and the lowercase letters (``sort:`` and future prompts).
# Append only: changing the order changes every token id.
CHARACTERS = "0123456789+-*=,|: ;.()abcdefghijklmnopqrstuvwxyz"

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")


class CharTokenizer:
    """Maps text to token ids one character at a time (see the module docstring)."""

    pad_id = 0
    bos_id = 1
    eos_id = 2
    stop_ids = (2,)  # the ids that end a response (the rollout engine's eos_id)

    def __init__(self) -> None:
        offset = len(SPECIAL_TOKENS)
        self._char_to_id = {ch: offset + i for i, ch in enumerate(CHARACTERS)}
        self._id_to_char = dict(enumerate(SPECIAL_TOKENS)) | {
            i: ch for ch, i in self._char_to_id.items()
        }

    @property
    def vocab_size(self) -> int:
        return len(SPECIAL_TOKENS) + len(CHARACTERS)

    def encode(self, text: str, bos: bool = True, eos: bool = False) -> list[int]:
        """Token ids of ``text``, optionally framed by BOS and EOS.

        Raises ValueError on a character outside the vocabulary, naming it.
        """
        try:
            ids = [self._char_to_id[ch] for ch in text]
        except KeyError as exc:
            raise ValueError(
                f"character {exc.args[0]!r} is not in the tokenizer vocabulary {CHARACTERS!r}"
            ) from None
        if bos:
            ids.insert(0, self.bos_id)
        if eos:
            ids.append(self.eos_id)
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``: stops at the first EOS, skips PAD and BOS.

        Accepts any iterable of ints (a list, or a 1-D tensor's ``tolist()``).
        """
        chars = []
        for raw in ids:
            token = int(raw)
            if token == self.eos_id:
                break
            if token in (self.pad_id, self.bos_id):
                continue
            try:
                chars.append(self._id_to_char[token])
            except KeyError:
                raise ValueError(
                    f"token id {token} is outside the vocabulary (size {self.vocab_size})"
                ) from None
        return "".join(chars)

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"
