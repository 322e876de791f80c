"""UTF-8 byte tokenizer: what a text task speaks on the lab's builtin model.

The character tokenizer (``trainer.tasks.tokenizer``) covers only the
built-in tasks' alphabet; a text file holds any text, so a text task on the
builtin model encodes bytes instead (an imported model uses its own
``tokenizer.json``, ``trainer.hf.tokenizer``)::

    id 0        PAD
    id 1        BOS
    id 2        EOS
    id 3 + b    the byte b (0..255)

    >>> ByteTokenizer().encode("Hi")
    [1, 75, 108]
"""

from __future__ import annotations

from collections.abc import Iterable

_OFFSET = 3


class ByteTokenizer:
    """Same interface as ``CharTokenizer``: pad/bos/eos ids, vocab_size, encode, decode."""

    pad_id = 0
    bos_id = 1
    eos_id = 2
    stop_ids = (2,)  # the ids that end a response (the rollout engine's eos_id)

    @property
    def vocab_size(self) -> int:
        return _OFFSET + 256

    def encode(self, text: str, bos: bool = True, eos: bool = False) -> list[int]:
        ids = [_OFFSET + b for b in text.encode("utf-8")]
        if bos:
            ids.insert(0, self.bos_id)
        if eos:
            ids.append(self.eos_id)
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        """Text up to the first EOS, without PAD/BOS; invalid UTF-8 becomes U+FFFD."""
        data = bytearray()
        for raw in ids:
            token = int(raw)
            if token == self.eos_id:
                break
            if token >= _OFFSET:
                data.append(token - _OFFSET)
        return data.decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return f"ByteTokenizer(vocab_size={self.vocab_size})"
