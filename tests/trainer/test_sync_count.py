"""Host syncs on the hot path, counted on the CPU (trainer.devices.sync_count):
none in the MoE forward and backward and in a decode step, one stop check per
``stop_check_every`` tokens in a rollout, and a stated small number per update."""

from __future__ import annotations

import pytest
import torch

from trainer.config import ModelConfig
from trainer.config.presets import resolve_preset
from trainer.devices.sync_count import count_syncs
from trainer.model import TransformerLM
from trainer.rollout.engine import RolloutEngine

VOCAB = 32


def test_counter_sees_every_kind_of_host_read():
    x = torch.tensor([1.0, 2.0, 3.0])
    with count_syncs() as syncs:
        x.sum().item()
        bool(x.all())
        int(x[0])
        float(x[1])
        x.tolist()
        x.numpy()
        x.cpu()
        x.nonzero()
        x[x > 1]
        y = x.clone()
        y[y > 2] = 0.0
        torch.bincount(torch.tensor([0, 2]), minlength=3)
        torch.repeat_interleave(torch.tensor([1, 2]))
        with torch.inference_mode():
            x.clone().max().item()
    assert syncs.by_kind == {
        "item": 5,
        "tolist": 1,
        "numpy": 1,
        "cpu": 1,
        "nonzero": 1,
        "boolean index": 2,
        "bincount": 1,
        "repeat_interleave": 1,
    }
    assert "test_sync_count.py" in syncs.report()


def test_counter_ignores_sync_free_ops_and_restores_tensor_methods():
    x = torch.randn(4, 5)
    with count_syncs() as syncs:
        x.argsort(-1)
        x.topk(2)
        x[torch.tensor([0, 2])]
        torch.searchsorted(torch.arange(5), torch.tensor([2, 3]))
        (x > 0).sum(0)
        torch.repeat_interleave(torch.tensor([1, 2]), output_size=3)
    assert syncs.total == 0, syncs.report()
    with count_syncs() as outer:
        x.tolist()
    assert outer.total == 1
    assert torch.Tensor.tolist.__qualname__ == "TensorBase.tolist"


def test_phases_label_the_syncs():
    with count_syncs() as syncs:
        with syncs.in_phase("update"):
            torch.ones(1).item()
        torch.ones(1).item()
    assert syncs.by_phase == {"update": 1, "-": 1}


def _tiny_moe() -> tuple[ModelConfig, TransformerLM]:
    cfg = resolve_preset("moe-grpo").model
    torch.manual_seed(0)
    return cfg, TransformerLM(cfg, VOCAB)


@pytest.mark.parametrize("backend", ["auto", "padded"])
def test_moe_training_forward_and_backward_make_no_sync(backend):
    _, model = _tiny_moe()
    for layer in model.moe_layers:
        layer.experts.backend = backend
    tokens = torch.randint(3, VOCAB, (4, 12))
    mask = torch.ones_like(tokens, dtype=torch.bool)
    mask[0, :4] = False
    with count_syncs() as syncs:
        out = model(tokens, attention_mask=mask, return_routing=True)
        out.logits.square().mean().backward()
    assert syncs.total == 0, syncs.report()


def _engine(precision: str = "fp32", every: int = 8) -> tuple[RolloutEngine, torch.Tensor]:
    cfg, model = _tiny_moe()
    engine = RolloutEngine(cfg, VOCAB, precision=precision, stop_check_every=every)
    engine.load_weights(model.state_dict())
    prompts = torch.randint(3, VOCAB, (5, 6), generator=torch.Generator().manual_seed(1))
    return engine, prompts


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp8"])
def test_decode_step_makes_no_sync(precision):
    engine, prompts = _engine(precision)
    mask = torch.ones_like(prompts, dtype=torch.bool)
    engine.generate(prompts, mask, max_new_tokens=2, eos_id=None)  # cache, rope table
    with torch.inference_mode(), count_syncs() as syncs:
        n_real, key_bias = engine._decode_state(mask, 8)
        routing = torch.zeros((engine.n_moe_layers, 5, 2), dtype=torch.uint8)
        engine.forward_pass.decode(prompts[:, -1], n_real, 6, key_bias[:, None, None, :7], routing)
    assert syncs.total == 0, syncs.report()


@pytest.mark.parametrize("every", [1, 4, 8])
def test_rollout_reads_the_host_once_per_stop_check(every):
    """No row stops (an EOS id outside the vocabulary): a stop check after every
    ``every`` steps but the last, plus one read of the columns used; none without EOS."""
    engine, prompts = _engine(every=every)
    mask = torch.ones_like(prompts, dtype=torch.bool)
    new = 12
    with count_syncs() as syncs:
        engine.generate(prompts, mask, max_new_tokens=new, eos_id=VOCAB + 5)
    checks = (new - 1) // every  # after steps every, 2 every, ... before the last one
    assert syncs.by_kind == {"item": checks + 1}, syncs.report()
    with count_syncs() as syncs:
        engine.generate(prompts, mask, max_new_tokens=new, eos_id=None)
    assert syncs.total == 0, syncs.report()
