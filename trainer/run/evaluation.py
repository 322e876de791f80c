"""Held-out accuracy: greedy decoding of the evaluation set with the rollout engine."""

from __future__ import annotations

import torch

from trainer.rollout import RolloutEngine
from trainer.run.batches import collate_prompts, decode_responses
from trainer.tasks import Problem, Task


@torch.no_grad()
def greedy_accuracy(
    engine: RolloutEngine,
    task: Task,
    problems: list[Problem],
    max_new_tokens: int,
    device: torch.device,
    batch_size: int = 256,
) -> float:
    """Share of ``problems`` the engine answers exactly right with greedy decoding."""
    if not problems:
        return 0.0
    tok = task.tokenizer
    correct = 0
    for start in range(0, len(problems), batch_size):
        chunk = problems[start : start + batch_size]
        prompts, prompt_mask = collate_prompts(chunk, tok, device)
        batch = engine.generate(
            prompts,
            prompt_mask,
            max_new_tokens=max_new_tokens,
            temperature=0.0,
            top_p=1.0,
            eos_id=tok.stop_ids,
            pad_id=tok.pad_id,
            generator=None,
        )
        texts = decode_responses(batch.tokens, batch.response_mask, tok)
        correct += sum(right for _, right in task.score(chunk, texts))
    return correct / len(problems)
