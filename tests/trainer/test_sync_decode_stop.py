"""The decode loop checks its stop condition every ``stop_check_every`` tokens:
tokens, log-probs, masks, routing and the sampling generator's state afterwards
are those of a check after every token (``stop_check_every=1``, the loop's
behaviour before the change), whether rows stop early, late or never."""

from __future__ import annotations

import pytest
import torch

from trainer.config.presets import resolve_preset
from trainer.model import TransformerLM
from trainer.rollout.engine import RolloutEngine

VOCAB = 32


def _rollout(every: int, precision: str, temperature: float, rows: int, eos: int | None):
    cfg = resolve_preset("moe-grpo").model
    torch.manual_seed(0)
    model = TransformerLM(cfg, VOCAB)
    engine = RolloutEngine(cfg, VOCAB, precision=precision, stop_check_every=every)
    engine.load_weights(model.state_dict())
    prompts = torch.randint(3, VOCAB, (rows, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(prompts, dtype=torch.bool)
    mask[0, :2] = False
    g = torch.Generator().manual_seed(3)
    batch = engine.generate(
        prompts, mask, max_new_tokens=20, temperature=temperature, eos_id=eos, generator=g
    )
    after = torch.rand(3, generator=g)  # the stream continues where it would have
    return batch, after


def _common_token(precision: str, temperature: float, rows: int, rank: int) -> int:
    """An EOS id the rows actually sample, so that they stop at various steps."""
    batch, _ = _rollout(1, precision, temperature, rows, None)
    values, counts = batch.tokens[:, 6:].flatten().unique(return_counts=True)
    order = counts.argsort(descending=True, stable=True)
    return int(values[order][min(rank, len(values) - 1)])


@pytest.mark.parametrize(
    ("precision", "temperature", "rows"),
    [("fp32", 1.0, 1), ("fp32", 0.0, 3), ("bf16", 1.0, 3), ("bf16", 1.0, 1)],
)
def test_sparse_stop_checks_change_nothing(precision, temperature, rows):
    stops = set()
    for eos in [None, *(_common_token(precision, temperature, rows, r) for r in range(3))]:
        reference, ref_after = _rollout(1, precision, temperature, rows, eos)
        stops.add(reference.tokens.shape[1])
        for every in (3, 8):
            batch, after = _rollout(every, precision, temperature, rows, eos)
            assert torch.equal(batch.tokens, reference.tokens), (every, eos)
            assert torch.equal(batch.logprobs, reference.logprobs)
            assert torch.equal(batch.attention_mask, reference.attention_mask)
            assert torch.equal(batch.response_mask, reference.response_mask)
            assert torch.equal(batch.routing.indices, reference.routing.indices)
            assert torch.equal(batch.routing_mask, reference.routing_mask)
            assert torch.equal(after, ref_after)
    if rows == 1:
        assert len(stops) > 1  # some rollouts stopped before max_new_tokens


def test_stop_check_every_is_validated():
    cfg = resolve_preset("moe-grpo").model
    with pytest.raises(ValueError, match="stop_check_every"):
        RolloutEngine(cfg, VOCAB, stop_check_every=0)
