"""The router-metrics callback on a tiny random Qwen3-MoE (tests/hf_tiny_checkpoints.py):
what the gate hooks count equals the routing recomputed from the model's own router
logits, no-grad passes and padding are left out, and a Trainer log gets the lab's
keys."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from hf_tiny_checkpoints import make_hf_model

from integrations.trl_router_metrics import (
    DEAD,
    RouterMetricsCallback,
    expert_load_key,
)
from trainer import metric_keys as mk
from trainer.algorithms.measure import max_violation


@pytest.fixture(scope="module")
def model():
    return make_hf_model("qwen3_moe", seed=3).train()


def _routing_counts(model, ids, mask=None):
    """Assignments per expert per MoE layer, recomputed from the router logits the model
    returns (``output_router_logits``), independently of the hooks."""
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, output_router_logits=True)
    k = model.config.num_experts_per_tok
    counts = []
    keep = None if mask is None else mask.reshape(-1).bool()
    for logits in out.router_logits:
        idx = torch.topk(torch.softmax(logits.float(), -1), k, dim=-1).indices
        if keep is not None:
            idx = idx[keep]
        counts.append(torch.bincount(idx.reshape(-1), minlength=logits.shape[-1]).double())
    return counts


def test_hooks_count_the_routing_of_grad_passes_only(model):
    callback = RouterMetricsCallback()
    assert callback.attach(model) == 2  # layers 0 and 2 (layer 1 is dense: mlp_only_layers)
    ids = torch.randint(0, 96, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0  # padding is not counted
    model(input_ids=ids, attention_mask=mask)  # grad enabled: counted
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)  # generation-like pass: not counted
    expected = _routing_counts(model, ids, mask)
    got = callback.collect()
    callback.detach()
    for layer, counts in zip((0, 2), expected, strict=True):
        shares = counts / counts.sum()
        for e in range(8):
            assert got[expert_load_key(layer, e)] == pytest.approx(float(shares[e]))
    assert got[mk.EXPERTS_MAX_VIOLATION] == pytest.approx(
        sum(max_violation(c) for c in expected) / 2
    )
    assert got[DEAD] == float(sum(int((c == 0).sum()) for c in expected))
    assert 0.0 < got[mk.EXPERTS_ROUTER_ENTROPY] <= float(torch.log(torch.tensor(8.0)))
    assert 0.0 < got[mk.EXPERTS_UTILIZATION] <= 1.0
    assert callback.collect() == {}  # the window was reset


def test_a_trainer_log_gets_the_metrics(model):
    callback = RouterMetricsCallback()
    callback.on_train_begin(None, None, None, model=model)
    model(input_ids=torch.randint(0, 96, (1, 5)))
    logs = {"loss": 1.0, "kl": 0.1}
    callback.on_log(None, None, None, logs=logs)
    callback.on_train_end(None, None, None)
    assert logs["loss"] == 1.0 and mk.EXPERTS_MAX_VIOLATION in logs
    assert sum(logs[expert_load_key(0, e)] for e in range(8)) == pytest.approx(1.0)
    assert not callback.handles
