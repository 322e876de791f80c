"""Batch collation for rollouts and the supervised warm start.

Every batch follows the layout of docs/trainer-internals.md::

    [ pad ... pad | BOS prompt | target ... EOS | pad ... pad ]
      left padding  (P columns, shared)  (response)   right padding

Prompts are LEFT-padded to a common width P so every response starts at
column P. A token's log-prob lives at the token's own position
(``logprob[b, t] = log p(tokens[b, t] | tokens[b, :t])``, from the logits at
``t - 1``), so ``loss_mask`` is True exactly on the target tokens and EOS.

Example (``tokens`` written as text, ``.`` = PAD, ``^`` = BOS, ``$`` = EOS)::

    problems: "1+2=" -> "3",  "10+20=" -> "30"
    tokens          . . ^ 1 + 2 = 3 $ .
                    ^ 1 0 + 2 0 = 3 0 $
    attention_mask  0 0 1 1 1 1 1 1 1 0
                    1 1 1 1 1 1 1 1 1 1
    loss_mask       0 0 0 0 0 0 0 1 1 0
                    0 0 0 0 0 0 0 1 1 1
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from trainer.tasks.base import Problem, prompt_ids
from trainer.tasks.tokenizer import CharTokenizer


def _check_nonempty(problems: Sequence[Problem]) -> None:
    if not problems:
        raise ValueError("cannot collate an empty list of problems")


def collate_prompts(
    problems: Sequence[Problem], tokenizer: CharTokenizer, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompts (BOS included) for the rollout engine.

    Returns ``prompt_tokens`` LongTensor (B, P) and ``prompt_mask`` BoolTensor
    (B, P), True on real tokens; P = the longest prompt of the batch.
    """
    _check_nonempty(problems)
    encoded = [prompt_ids(tokenizer, p) for p in problems]
    width = max(map(len, encoded))
    rows = [[tokenizer.pad_id] * (width - len(ids)) + ids for ids in encoded]
    masks = [[False] * (width - len(ids)) + [True] * len(ids) for ids in encoded]
    return (
        torch.tensor(rows, dtype=torch.long, device=device),
        torch.tensor(masks, dtype=torch.bool, device=device),
    )


def collate_sft(
    problems: Sequence[Problem], tokenizer: CharTokenizer, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prompt + supervised target batch for the warm start (layout in the module docstring).

    Returns ``tokens`` LongTensor (B, T), ``attention_mask`` BoolTensor (B, T)
    (True on prompt, target and EOS) and ``loss_mask`` BoolTensor (B, T) (True
    on target tokens and EOS), with T = P + the longest target (EOS included).
    """
    _check_nonempty(problems)
    prompts = [prompt_ids(tokenizer, p) for p in problems]
    targets = [tokenizer.encode(p.target, bos=False, eos=True) for p in problems]
    prompt_width = max(map(len, prompts))
    width = prompt_width + max(map(len, targets))
    rows, attention, loss = [], [], []
    for prompt, target in zip(prompts, targets, strict=True):
        left = prompt_width - len(prompt)
        right = width - prompt_width - len(target)
        rows.append([tokenizer.pad_id] * left + prompt + target + [tokenizer.pad_id] * right)
        attention.append([False] * left + [True] * (len(prompt) + len(target)) + [False] * right)
        loss.append([False] * prompt_width + [True] * len(target) + [False] * right)
    return (
        torch.tensor(rows, dtype=torch.long, device=device),
        torch.tensor(attention, dtype=torch.bool, device=device),
        torch.tensor(loss, dtype=torch.bool, device=device),
    )


def repeat_for_groups(problems: Sequence[Problem], group_size: int) -> list[Problem]:
    """Each problem ``group_size`` times in a row: ``[p0, p0, ..., p1, p1, ...]``.

    Row ``i`` of the resulting batch belongs to group ``i // group_size``, the
    layout GRPO's group-normalised advantages reshape as (n_prompts, group_size).
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    return [p for p in problems for _ in range(group_size)]


def decode_responses(
    tokens: torch.Tensor, response_mask: torch.Tensor, tokenizer: CharTokenizer
) -> list[str]:
    """Response text of each row: the tokens under ``response_mask``, cut at EOS.

    tokens: LongTensor (B, T); response_mask: BoolTensor (B, T).
    """
    rows = tokens.detach().cpu().tolist()
    masks = response_mask.detach().cpu().tolist()
    return [
        tokenizer.decode(t for t, keep in zip(row, mask, strict=True) if keep)
        for row, mask in zip(rows, masks, strict=True)
    ]
