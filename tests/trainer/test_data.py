"""Batch collation layout, checked by hand (docs/trainer-internals.md)."""

from __future__ import annotations

import pytest
import torch

from trainer.run.batches import collate_prompts, collate_sft, decode_responses, repeat_for_groups
from trainer.tasks import CharTokenizer, Problem

TOK = CharTokenizer()
SHORT = Problem(prompt="1+2=", answer="3", target="3")
LONG = Problem(prompt="10+20=", answer="30", target="30")


def ids(text: str) -> list[int]:
    return TOK.encode(text, bos=False)


def test_collate_prompts_left_pads():
    tokens, mask = collate_prompts([SHORT, LONG], TOK, device="cpu")
    assert tokens.dtype == torch.long and mask.dtype == torch.bool
    assert tokens.shape == mask.shape == (2, 7)
    pad, bos = TOK.pad_id, TOK.bos_id
    assert tokens.tolist() == [
        [pad, pad, bos, *ids("1+2=")],
        [bos, *ids("10+20=")],
    ]
    assert mask.tolist() == [[False, False] + [True] * 5, [True] * 7]


def test_collate_sft_layout_by_hand():
    tokens, attention, loss = collate_sft([SHORT, LONG], TOK, device="cpu")
    pad, bos, eos = TOK.pad_id, TOK.bos_id, TOK.eos_id
    # P = 7 prompt columns, then the longest target "30" + EOS: T = 10.
    assert tokens.tolist() == [
        [pad, pad, bos, *ids("1+2="), *ids("3"), eos, pad],
        [bos, *ids("10+20="), *ids("30"), eos],
    ]
    assert attention.int().tolist() == [
        [0, 0, 1, 1, 1, 1, 1, 1, 1, 0],
        [1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
    ]
    # Loss on the target tokens and EOS, at their own positions.
    assert loss.int().tolist() == [
        [0, 0, 0, 0, 0, 0, 0, 1, 1, 0],
        [0, 0, 0, 0, 0, 0, 0, 1, 1, 1],
    ]
    assert attention.dtype == loss.dtype == torch.bool
    assert not (loss & ~attention).any()


def test_collate_sft_prompt_block_matches_collate_prompts():
    problems = [LONG, SHORT, Problem("sort:43,7,91=", "7,43,91", "7,43,91")]
    prompt_tokens, prompt_mask = collate_prompts(problems, TOK)
    tokens, attention, loss = collate_sft(problems, TOK)
    width = prompt_tokens.shape[1]
    assert torch.equal(tokens[:, :width], prompt_tokens)
    assert torch.equal(attention[:, :width], prompt_mask)
    assert not loss[:, :width].any()
    # Every row's supervised tokens decode to its target.
    for row, mask, problem in zip(tokens, loss, problems, strict=True):
        assert TOK.decode(row[mask].tolist()) == problem.target
        assert row[mask][-1].item() == TOK.eos_id


def test_repeat_for_groups_keeps_groups_consecutive():
    a, b = SHORT, LONG
    assert repeat_for_groups([a, b], 3) == [a, a, a, b, b, b]
    assert repeat_for_groups([a, b], 1) == [a, b]
    with pytest.raises(ValueError):
        repeat_for_groups([a], 0)


def test_decode_responses_reads_the_masked_tokens():
    tokens, _, loss = collate_sft([SHORT, LONG], TOK)
    assert decode_responses(tokens, loss, TOK) == ["3", "30"]


def test_empty_batch_is_rejected():
    with pytest.raises(ValueError):
        collate_prompts([], TOK)
    with pytest.raises(ValueError):
        collate_sft([], TOK)
