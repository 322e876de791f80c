"""Training model: shapes, positions from the mask, KV-cache decoding, replay plumbing."""

from __future__ import annotations

import pytest
import torch

from trainer.model import KVCache, TransformerLM, positions_from_mask


def test_positions_start_at_zero_after_left_padding():
    mask = torch.tensor([[False, False, True, True, True], [True, True, True, True, False]])
    assert positions_from_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 3]]


@pytest.mark.parametrize("value_head", [False, True])
def test_output_shapes_and_dtypes(tiny_moe_cfg, make_batch, value_head):
    model = TransformerLM(tiny_moe_cfg, vocab_size=20, value_head=value_head)
    tokens, mask = make_batch(20, [5, 7, 3], 7)
    out = model(tokens, attention_mask=mask, return_routing=True)
    assert out.logits.shape == (3, 7, 20) and out.logits.dtype == torch.float32
    assert (out.values is not None) == value_head
    if value_head:
        assert out.values.shape == (3, 7)
    assert len(out.routing) == tiny_moe_cfg.n_layers == len(model.moe_layers)
    r = out.routing[0]
    assert r.logits.shape == r.probs.shape == (3, 7, 8)
    assert r.natural_indices.shape == r.used_indices.shape == r.gates.shape == (3, 7, 2)
    assert torch.isfinite(out.logits).all()


def test_tied_embeddings(tiny_moe_cfg):
    model = TransformerLM(tiny_moe_cfg, vocab_size=20)
    assert model.lm_head.weight is model.tok_emb.weight
    untied = TransformerLM(tiny_moe_cfg.model_copy(update={"tie_embeddings": False}), 20)
    assert untied.lm_head.weight is not untied.tok_emb.weight


def test_dense_model_has_no_moe_layers(tiny_dense_cfg, make_batch):
    model = TransformerLM(tiny_dense_cfg, vocab_size=20)
    tokens, mask = make_batch(20, [4, 6], 6)
    out = model(tokens, attention_mask=mask, return_routing=True)
    assert model.moe_layers == [] and out.routing == []
    assert model.blocks[0].ffn.hidden == tiny_dense_cfg.resolved_dense_hidden


@pytest.mark.parametrize("positional", ["rope", "learned"])
def test_left_padding_does_not_change_real_token_logits(tiny_moe_cfg, positional):
    cfg = tiny_moe_cfg.model_copy(update={"positional": positional})
    torch.manual_seed(0)
    model = TransformerLM(cfg, vocab_size=20).eval()
    seq = torch.randint(3, 20, (1, 5))
    padded = torch.cat((torch.zeros(1, 3, dtype=torch.long), seq), dim=1)
    mask = torch.tensor([[False] * 3 + [True] * 5])
    with torch.no_grad():
        alone = model(seq).logits
        with_pad = model(padded, attention_mask=mask).logits
    torch.testing.assert_close(with_pad[:, 3:], alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("positional", ["rope", "learned"])
def test_kv_cache_decoding_matches_full_forward(tiny_moe_cfg, make_batch, positional):
    cfg = tiny_moe_cfg.model_copy(update={"positional": positional})
    torch.manual_seed(1)
    model = TransformerLM(cfg, vocab_size=20).eval()
    tokens, mask = make_batch(20, [6, 9, 4], 9)
    prompt = 5
    with torch.no_grad():
        full = model(tokens, attention_mask=mask).logits
        cache = KVCache(cfg.n_layers)
        steps = [model(tokens[:, :prompt], mask[:, :prompt], kv_cache=cache).logits]
        for t in range(prompt, tokens.shape[1]):
            steps.append(model(tokens[:, t : t + 1], mask[:, t : t + 1], kv_cache=cache).logits)
    incremental = torch.cat(steps, dim=1)
    torch.testing.assert_close(incremental[mask], full[mask], rtol=1e-5, atol=1e-5)


def test_routing_override_needs_one_entry_per_moe_layer(tiny_moe_cfg):
    model = TransformerLM(tiny_moe_cfg, vocab_size=20)
    tokens = torch.randint(0, 20, (1, 4))
    with pytest.raises(ValueError, match="one entry per MoE layer"):
        model(tokens, routing_override=[torch.zeros(1, 4, 2, dtype=torch.long)])


def test_model_replay_of_natural_routing_is_bit_identical_and_keeps_router_grad(
    tiny_moe_cfg, make_batch
):
    torch.manual_seed(2)
    model = TransformerLM(tiny_moe_cfg, vocab_size=20)
    tokens, mask = make_batch(20, [5, 3], 5)
    natural = model(tokens, attention_mask=mask, return_routing=True)
    override = [r.natural_indices for r in natural.routing]
    replayed = model(tokens, attention_mask=mask, routing_override=override)
    assert torch.equal(natural.logits, replayed.logits)

    shifted = [(r + 1) % tiny_moe_cfg.n_experts for r in override]
    model(tokens, attention_mask=mask, routing_override=shifted).logits.logsumexp(
        -1
    ).sum().backward()
    for layer in model.moe_layers:
        assert layer.router.weight.grad.abs().sum() > 0


def test_set_router_temperature(tiny_moe_cfg):
    model = TransformerLM(tiny_moe_cfg, vocab_size=20)
    model.set_router_temperature(1.5)
    assert all(float(layer.router.temperature) == 1.5 for layer in model.moe_layers)
    assert "blocks.0.ffn.router.temperature" in model.state_dict()


def test_bf16_autocast_forward_keeps_fp32_logits_and_router(tiny_moe_cfg, make_batch):
    model = TransformerLM(tiny_moe_cfg, vocab_size=20)
    tokens, mask = make_batch(20, [5, 3], 5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(tokens, attention_mask=mask, return_routing=True)
    assert out.logits.dtype == torch.float32
    assert all(r.probs.dtype == torch.float32 for r in out.routing)
    out.logits.float().sum().backward()
    assert torch.isfinite(model.tok_emb.weight.grad).all()


def test_dense_swiglu_equals_the_fused_gate_up_layout():
    """Three plain linears compute what one fused gate|up linear computed (Shazeer 2020)."""
    import torch.nn.functional as F

    from trainer.model.layers import SwiGLU

    torch.manual_seed(0)
    ffn = SwiGLU(16, 24)
    x = torch.randn(3, 5, 16)
    gate_up = torch.cat((ffn.w_gate.weight, ffn.w_up.weight), dim=0)  # (2H, D)
    gate, up = F.linear(x, gate_up).chunk(2, dim=-1)
    fused = F.linear(F.silu(gate) * up, ffn.w_down.weight)
    torch.testing.assert_close(ffn(x), fused, rtol=1e-6, atol=1e-6)
