"""The builtin model's tokenizers written as Hugging Face tokenizer files, so an
exported builtin model loads with ``AutoTokenizer`` and encodes text to the
ids it was trained on.

* ``char`` (``trainer.tasks.tokenizer.CharTokenizer``, the arithmetic and sort
  tasks): a word-level vocabulary of one token per character.
* ``byte`` (``trainer.tasks.byte_tokenizer.ByteTokenizer``, text tasks): a BPE
  without merges over GPT-2's byte-to-unicode alphabet (Radford et al. 2019),
  so every UTF-8 byte b is the one token 3 + b.

Both: ``<pad>`` 0, ``<bos>`` 1, ``<eos>`` 2; the post-processor puts BOS in
front of every encoded text, as the lab's ``encode(text, bos=True)`` does.
"""

from __future__ import annotations

import json
from pathlib import Path

SPECIALS = {"<pad>": 0, "<bos>": 1, "<eos>": 2}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character map."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(printable, map(chr, chars), strict=True))


def write_builtin_tokenizer(kind: str, out: Path) -> dict[str, int]:
    """Write tokenizer.json + tokenizer_config.json for ``kind`` ("char" or
    "byte") into ``out``; returns the special token ids."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    if kind == "char":
        from trainer.tasks.tokenizer import CHARACTERS

        vocab = SPECIALS | {ch: len(SPECIALS) + i for i, ch in enumerate(CHARACTERS)}
        tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
        tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
        tok.decoder = decoders.Fuse()
    elif kind == "byte":
        alphabet = _bytes_to_unicode()
        vocab = SPECIALS | {alphabet[b]: len(SPECIALS) + b for b in range(256)}
        tok = Tokenizer(models.BPE(vocab, merges=[]))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.decoder = decoders.ByteLevel()
    else:
        raise ValueError(f"unknown builtin tokenizer {kind!r}")
    tok.add_special_tokens(list(SPECIALS))
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", SPECIALS["<bos>"])]
    )
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "add_bos_token": True,
        "model_max_length": 1_000_000,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
