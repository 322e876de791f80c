"""bf16 training parameters with fp32 master weights and fp32 AdamW state
(``optim.param_dtype``), the routers kept fp32; a run trains and resumes with them."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from trainer.config import apply_overrides
from trainer.config.presets import preset_dict
from trainer.devices.precision import MasterWeights, cast_parameters
from trainer.run.checkpoint import load_checkpoint
from trainer.run.runner import train
from trainer.run_folder.files import read_metrics
from trainer.validation import validate_config


def test_small_updates_accumulate_in_the_master_not_in_bf16():
    """w = 1 in bf16 has neighbours 1 - 2^-8 and 1 + 2^-7 (spacing 2^-7 = 0.0078125 above 1).
    Each step subtracts lr * grad = 1e-3 (plain SGD, gradient 1): bf16 alone rounds every
    step back to 1; the fp32 master reaches 1 - 5e-3 after 5 steps, which rounds to
    1 - 2^-8 = 0.99609375 (|0.995 - 0.99609375| < |0.995 - 1|)."""
    layer = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        layer.weight.fill_(1.0)
    alone = layer.weight.detach().to(torch.bfloat16)
    cast_parameters(layer, "bf16")
    masters = MasterWeights(layer)
    opt = torch.optim.SGD([masters.optimizer_param(p) for p in layer.parameters()], lr=1e-3)
    for _ in range(5):
        alone = (alone - 1e-3).to(torch.bfloat16)
        masters.zero_model_grads()
        layer(torch.ones(1, 1, dtype=torch.bfloat16)).sum().backward()  # d out / d w = 1
        masters.grads_to_masters()
        opt.step()
        masters.masters_to_params()
    assert alone.item() == 1.0
    master = masters.pairs[0][1]
    assert master.dtype == torch.float32
    assert math.isclose(master.item(), 0.995, abs_tol=1e-6)
    assert layer.weight.dtype == torch.bfloat16 and layer.weight.item() == 0.99609375


def test_cast_keeps_the_routers_fp32():
    from trainer.model.transformer import TransformerLM

    cfg = validate_config({}).model
    model = TransformerLM(cfg, 51)
    cast_parameters(model, "bf16")
    dtypes = {name: p.dtype for name, p in model.named_parameters()}
    assert dtypes["blocks.0.ffn.router.weight"] == torch.float32
    assert dtypes["blocks.0.attn.qkv.weight"] == torch.bfloat16
    assert dtypes["blocks.1.ffn.experts.w_gate"] == torch.bfloat16
    assert MasterWeights(TransformerLM(cfg, 51)).pairs == []  # fp32: nothing to keep


FAST = [
    "run.steps=3",
    "run.checkpoint_every=1",
    "run.eval_every=3",
    "run.threads=1",
    "rollout.prompts_per_step=2",
    "rollout.group_size=4",
    "algorithm.minibatches=1",
    "warm_start.max_steps=4",
    "warm_start.eval_every=2",
    "warm_start.eval_size=8",
    "task.eval_size=8",
    "optim.param_dtype=bf16",
    "optim.lr=1e-3",
]


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("MOE_LAB_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.mark.slow
def test_a_bf16_run_trains_with_fp32_masters_and_adam_state_and_resumes(tmp_path):
    cfg = validate_config(apply_overrides(preset_dict("moe-grpo"), FAST))
    summary = train(cfg, tmp_path / "straight")
    assert summary["status"] == "succeeded"
    ckpt = load_checkpoint(tmp_path / "straight")
    policy, updater = ckpt["policy"], ckpt["updater"]
    assert policy["blocks.0.attn.qkv.weight"].dtype == torch.bfloat16
    assert policy["blocks.0.ffn.router.weight"].dtype == torch.float32
    masters = updater["master_weights"]["masters"]
    assert masters and all(m.dtype == torch.float32 for m in masters)
    moments = [s["exp_avg"] for s in updater["optimizer"]["state"].values()]
    assert moments and all(m.dtype == torch.float32 for m in moments)
    # every bf16 weight (the tied embedding and head once) is its master rounded
    low = list({v.data_ptr(): v for v in policy.values() if v.dtype == torch.bfloat16}.values())
    assert len(low) == len(masters)
    assert all(torch.equal(w, m.to(torch.bfloat16)) for w, m in zip(low, masters, strict=True))
    # resuming restores the masters: the same stream as the straight run
    train(cfg, tmp_path / "resumed", stop_after=2)
    train(cfg, tmp_path / "resumed", resume=True)

    def comparable(rows):
        return [
            {k: v for k, v in r.items() if not k.startswith(("time/", "throughput/"))} for r in rows
        ]

    assert comparable(read_metrics(tmp_path / "resumed")) == comparable(
        read_metrics(tmp_path / "straight")
    )
