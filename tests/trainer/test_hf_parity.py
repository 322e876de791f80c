"""Parity with transformers' own implementation of each supported family.

A tiny random checkpoint is made offline with transformers' classes and
saved into tmp_path; the lab imports it (safetensors + config.json only) and
must reproduce, in fp32:

* the training forward's logits within 1e-4 (max abs diff; measured at most
  9.5e-07 for the MoE families, 0 for the dense ones, logits of magnitude ~3),
* the rollout engine's greedy generation = ``generate(do_sample=False)``
  token for token over 32 new tokens,
* each MoE layer's top-k expert set = transformers' (``output_router_logits``).
"""

from __future__ import annotations

import pytest
import torch
from hf_tiny_checkpoints import FAMILY_KWARGS, import_checkpoint, save_hf_checkpoint

from trainer.config import ModelConfig
from trainer.hf import FAMILIES
from trainer.model.layers import positions_from_mask
from trainer.rollout.engine import RolloutEngine

pytest.importorskip("transformers")

MOE = ("qwen3_moe", "qwen2_moe", "olmoe", "mixtral")
LOGIT_TOL = 1e-4


def _import(folder) -> tuple[ModelConfig, torch.nn.Module]:
    return import_checkpoint(folder)


def _engine_and_prompt(tmp_path, family: str, rows: int):
    """The family's tiny checkpoint in transformers and in the lab's fp32 engine, and
    ``rows`` random 7-token prompts: (hf model, engine, prompt, mask)."""
    hf = save_hf_checkpoint(family, tmp_path)
    cfg, model = _import(tmp_path)
    engine = RolloutEngine(cfg, cfg.vocab_size, precision="fp32")
    engine.load_weights(model.state_dict())
    gen = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, cfg.vocab_size, (rows, 7), generator=gen)
    return hf, engine, prompt, torch.ones_like(prompt, dtype=torch.bool)


def _batch(vocab: int):
    """Two rows, the first left-padded by 3: tokens, mask (2, 12)."""
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, vocab, (2, 12), generator=gen)
    mask = torch.ones_like(tokens, dtype=torch.bool)
    mask[0, :3] = False
    return tokens, mask


@pytest.mark.parametrize("family", FAMILIES)
def test_training_forward_logits_match_transformers(family, tmp_path):
    hf = save_hf_checkpoint(family, tmp_path)
    cfg, model = _import(tmp_path)
    assert cfg.family == family
    tokens, mask = _batch(cfg.vocab_size)
    with torch.no_grad():
        ours = model(tokens, mask).logits
        theirs = hf(
            input_ids=tokens, attention_mask=mask.long(), position_ids=positions_from_mask(mask)
        ).logits
    diff = (ours - theirs)[mask].abs().max().item()
    assert diff < LOGIT_TOL, f"{family}: max |logit diff| {diff:.2e}"


@pytest.mark.parametrize("family", FAMILIES)
def test_rollout_engine_greedy_generation_matches_transformers_generate(family, tmp_path):
    hf, engine, prompt, mask = _engine_and_prompt(tmp_path, family, rows=1)
    ours = engine.generate(prompt, mask, max_new_tokens=32, temperature=0.0).tokens
    with torch.no_grad():
        theirs = hf.generate(
            prompt,
            attention_mask=mask.long(),
            max_new_tokens=32,
            do_sample=False,
            min_new_tokens=32,
        )
    assert ours.shape == theirs.shape == (1, 7 + 32)
    assert torch.equal(ours, theirs), f"{family}: generations differ"


@pytest.mark.parametrize("family", MOE)
def test_router_topk_sets_match_transformers_on_every_moe_layer(family, tmp_path):
    hf = save_hf_checkpoint(family, tmp_path)
    cfg, model = _import(tmp_path)
    tokens = torch.randint(0, cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        ours = model(tokens, return_routing=True).routing
        theirs = hf(input_ids=tokens, output_router_logits=True).router_logits
    n_moe = sum(cfg.is_moe_block(i) for i in range(cfg.n_layers))
    assert len(ours) == len(theirs) == n_moe
    for layer, (mine, logits) in enumerate(zip(ours, theirs, strict=True)):
        their_sets = logits.view(2, 16, -1).topk(cfg.top_k, dim=-1).indices.sort(-1).values
        my_sets = mine.natural_indices.sort(-1).values
        assert torch.equal(my_sets, their_sets), f"{family} MoE layer {layer}: top-k sets differ"


def test_qwen3_moe_dense_layers_come_from_mlp_only_layers(tmp_path):
    save_hf_checkpoint("qwen3_moe", tmp_path)
    cfg, model = _import(tmp_path)
    assert FAMILY_KWARGS["qwen3_moe"]["mlp_only_layers"] == [1]
    assert cfg.dense_layers == [1]
    assert [block.is_moe for block in model.blocks] == [True, False, True]
    assert cfg.head_dim == 24 and cfg.n_kv_heads == 2 and cfg.rope_theta == 1e6


def test_generation_stops_at_any_listed_eos_id_as_transformers_does(tmp_path):
    """generation_config.json's eos_token_id list: transformers' generate ends a row at
    the first listed id it samples, and so does the engine (two rows, two ids)."""
    hf, engine, prompt, mask = _engine_and_prompt(tmp_path, "qwen3_moe", rows=2)
    free = engine.generate(prompt, mask, max_new_tokens=24, temperature=0.0).tokens
    stops = [int(free[0, 7 + 5]), int(free[1, 7 + 9])]  # tokens each row samples anyway
    ours = engine.generate(prompt, mask, 24, temperature=0.0, eos_id=stops, pad_id=0)
    with torch.no_grad():
        theirs = hf.generate(
            prompt, attention_mask=mask.long(), max_new_tokens=24, do_sample=False,
            eos_token_id=stops, pad_token_id=0,
        )  # fmt: skip
    width = max(ours.tokens.shape[1], theirs.shape[1])

    def padded(t):
        return torch.nn.functional.pad(t, (0, width - t.shape[1]))

    assert torch.equal(padded(ours.tokens), padded(theirs))
    assert ours.tokens.shape[1] < 7 + 24  # both rows stopped early
