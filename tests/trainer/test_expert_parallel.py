"""Expert-parallel MoE layer on 2 and 4 gloo ranks equals the single-process layer.

Each rank holds different tokens (unequal counts: uneven splits) and a slice of
the experts; the reference is one ``MoELayer`` over every rank's tokens. Outputs,
input gradients, router gradients (summed over ranks, since each rank's router
sees only its own tokens) and expert gradients (each on its owning rank) agree
within 1e-5: the all-to-all moves rows without arithmetic, so the only
differences are the summation order of the expert-gradient GEMMs over fewer,
reordered rows.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from distributed_ranks import run_ranks

from trainer.distributed import DistContext
from trainer.model.expert_parallel import shard_experts_
from trainer.model.moe import MoELayer

TOL = 1e-5
D, E, K, H, T = 16, 8, 2, 12, 5


def _layer() -> MoELayer:
    torch.manual_seed(0)
    layer = MoELayer(D, E, K, H)
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return layer


def _inputs(world: int, case: str) -> list[dict[str, torch.Tensor]]:
    """Per rank: tokens (B_r, T, D) with B_r = r + 1, loss weights, replay override."""
    gen = torch.Generator().manual_seed(7)
    out = []
    for r in range(world):
        b = r + 1
        item = {"x": torch.randn(b, T, D, generator=gen), "w": torch.randn(b, T, D, generator=gen)}
        if case == "replay":
            item["override"] = torch.rand(b, T, E, generator=gen).topk(K, dim=-1).indices
            item["mask"] = torch.rand(b, T, generator=gen) < 0.6
        out.append(item)
    return out


def _prepare(layer: MoELayer, case: str) -> None:
    if case == "empty_rank":  # selection bias: only the first half of the experts is chosen
        with torch.no_grad():
            layer.router.selection_bias[: E // 2] = 100.0


def _rank(dist: DistContext, out_dir: Path, case: str) -> None:
    layer = _layer()
    _prepare(layer, case)
    ep = shard_experts_(layer, dist.rank, dist.world_size)
    item = _inputs(dist.world_size, case)[dist.rank]
    x = item["x"].clone().requires_grad_(True)
    y, routing = ep(x, item.get("override"), item.get("mask"), return_routing=True)
    (y * item["w"]).sum().backward()
    torch.save(
        {
            "y": y.detach(),
            "x_grad": x.grad,
            "router_grad": ep.router.weight.grad,
            "w_gate": ep.experts.w_gate.grad,
            "w_up": ep.experts.w_up.grad,
            "w_down": ep.experts.w_down.grad,
            "used": routing.used_indices,
        },
        out_dir / f"rank{dist.rank}.pt",
    )


def _reference(world: int, case: str) -> dict[str, torch.Tensor]:
    layer = _layer()
    _prepare(layer, case)
    items = _inputs(world, case)
    x = torch.cat([i["x"] for i in items]).requires_grad_(True)
    override = torch.cat([i["override"] for i in items]) if case == "replay" else None
    mask = torch.cat([i["mask"] for i in items]) if case == "replay" else None
    y, routing = layer(x, override, mask, return_routing=True)
    (y * torch.cat([i["w"] for i in items])).sum().backward()
    e = layer.experts
    return {"y": y.detach(), "x_grad": x.grad, "router_grad": layer.router.weight.grad,
            "w_gate": e.w_gate.grad, "w_up": e.w_up.grad, "w_down": e.w_down.grad,
            "used": routing.used_indices, "natural": routing.natural_indices}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    ("world", "case"),
    [(2, "natural"), (2, "replay"), (2, "empty_rank"), (4, "natural"), (4, "replay")],
)
def test_expert_parallel_layer_equals_single_process(tmp_path, world, case):
    run_ranks(_rank, world, tmp_path, case)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    ref = _reference(world, case)
    for key in ("y", "x_grad", "used"):
        torch.testing.assert_close(torch.cat([r[key] for r in ranks]), ref[key], atol=TOL, rtol=0)
    router = torch.stack([r["router_grad"] for r in ranks]).sum(0)
    torch.testing.assert_close(router, ref["router_grad"], atol=TOL, rtol=0)
    for key in ("w_gate", "w_up", "w_down"):
        experts = torch.cat([r[key] for r in ranks])  # rank r holds experts r*E/W...
        torch.testing.assert_close(experts, ref[key], atol=TOL, rtol=0)
    if case == "empty_rank":  # the second half of the experts got no token and no gradient
        assert not (ref["used"] >= E // 2).any()
        assert all(float(r["w_down"].abs().sum()) == 0.0 for r in ranks[world // 2 :])
    if case == "replay":  # the override really replaced the router's own choice somewhere
        assert (ref["used"] != ref["natural"]).any()


# ---------------------------------------------------------------- rollout engine

ENGINE_NEW_TOKENS = 12


# GPT-OSS's experts (biases split with their experts, the clamped SwiGLU) and
# DeepSeek's sigmoid group-limited router with a live selection bias.
ENGINE_FEATURES = {
    "plain": {},
    "gpt_oss_deepseek": {
        "expert_ffn": {"bias": True, "activation": "clamped_swiglu", "limit": 1.0},
        "router": {"score": "sigmoid", "n_groups": 4, "topk_groups": 2, "scaling": 2.5},
        "attention_sinks": True,
    },
}


def _engine_setup(features: str = "plain"):
    """A tiny MoE policy (same seed on every rank) and per-rank prompt batches of
    different sizes; EOS is the token the untrained policy emits most, so rows
    stop at different steps and ranks finish decoding at different times."""
    from trainer.config import ModelConfig
    from trainer.config.presets import resolve_preset
    from trainer.model import TransformerLM

    base = resolve_preset("moe-grpo").model
    cfg = ModelConfig.model_validate({**base.model_dump(), **ENGINE_FEATURES[features]})
    torch.manual_seed(0)
    model = TransformerLM(cfg, 32)
    with torch.no_grad():  # biases that matter
        for name, param in model.named_parameters():
            if name.endswith((".b_gate", ".b_up", ".b_down", "sinks")):
                param.normal_(0.0, 0.2)
        if features != "plain":
            for layer in model.moe_layers:
                layer.router.selection_bias.normal_(0.0, 0.05)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 32, (r + 1, 6), generator=gen) for r in range(4)]
    return cfg, model, prompts


def _engine_rank(dist: DistContext, out_dir: Path, eos_id: int, features: str) -> None:
    from trainer.model.expert_parallel import ExpertShard, expert_shards
    from trainer.rollout import RolloutEngine

    cfg, model, prompts = _engine_setup(features)
    for block in model.blocks:
        if block.is_moe:
            shard_experts_(block.ffn, dist.rank, dist.world_size)
    engine = RolloutEngine(cfg, 32, precision="fp32")
    shards = expert_shards(model)
    engine.expert_shard = next(iter(shards.values()))
    assert isinstance(engine.expert_shard, ExpertShard)
    engine.load_weights(model.state_dict())  # this rank's experts only
    tokens = prompts[dist.rank]
    batch = engine.generate(
        tokens, torch.ones_like(tokens, dtype=torch.bool), ENGINE_NEW_TOKENS,
        temperature=0.0, eos_id=eos_id,
    )  # fmt: skip
    torch.save({"tokens": batch.tokens, "logprobs": batch.logprobs}, out_dir / f"e{dist.rank}.pt")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("world", "features"), [(2, "plain"), (4, "plain"), (2, "gpt_oss_deepseek")]
)
def test_expert_parallel_rollout_engine_generates_what_one_process_does(tmp_path, world, features):
    from trainer.rollout import RolloutEngine

    cfg, model, prompts = _engine_setup(features)
    engine = RolloutEngine(cfg, 32, precision="fp32")
    engine.load_weights(model.state_dict())
    # EOS = the first greedy token of rank 0's first row: that row stops at once,
    # the others decode on, so the group must keep decoding in lockstep.
    first = engine.generate(prompts[0], torch.ones_like(prompts[0], dtype=torch.bool), 1, 0.0)
    eos_id = int(first.tokens[0, -1])
    reference = [
        engine.generate(
            p, torch.ones_like(p, dtype=torch.bool), ENGINE_NEW_TOKENS, 0.0, eos_id=eos_id
        )
        for p in prompts[:world]
    ]
    lengths = {r.tokens.shape[1] for r in reference}
    run_ranks(_engine_rank, world, tmp_path, eos_id, features)
    for rank, ref in enumerate(reference):
        got = torch.load(tmp_path / f"e{rank}.pt")
        assert torch.equal(got["tokens"], ref.tokens)
        torch.testing.assert_close(got["logprobs"], ref.logprobs, atol=1e-5, rtol=0)
    assert len(lengths) > 1  # ranks stopped decoding at different steps: lockstep was needed
