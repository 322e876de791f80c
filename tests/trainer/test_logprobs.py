"""The LM head at the positions that need it (trainer.algorithms.logprobs): the same
log-probs, entropy and gradients as the full head, to fp32 rounding."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import pytest
import torch

from trainer.algorithms.logprobs import head_positions, packed_entropy, packed_logprobs
from trainer.algorithms.losses import entropy_from_logits, gather_logprobs
from trainer.config import ModelConfig
from trainer.model import TransformerLM


def test_a_hand_case():
    """Row (b=0, t=0) has logits (0, ln 2): p = (1/3, 2/3), so log p(token 1) = ln(2/3)
    at t = 1 and the entropy -(1/3 ln 1/3 + 2/3 ln 2/3) = 0.63651 at t = 0."""
    tokens = torch.tensor([[0, 1]])
    positions = torch.tensor([[True, False]])
    logits = torch.tensor([[0.0, math.log(2.0)]])
    logp, lsm = packed_logprobs(logits, tokens, positions)
    assert logp.tolist()[0][0] == 0.0
    assert logp[0, 1].item() == pytest.approx(math.log(2 / 3), abs=1e-6)
    entropy = packed_entropy(lsm, positions)
    assert entropy[0, 0].item() == pytest.approx(0.636514, abs=1e-6) and entropy[0, 1] == 0
    assert head_positions(torch.tensor([[False, True, True]]), entropy=False).tolist() == [
        [True, True, False]
    ]
    assert head_positions(torch.tensor([[False, True, True]]), entropy=True).tolist() == [
        [True, True, True]
    ]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_head_at_response_positions_matches_the_full_head(temperature):
    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=4, n_experts=4, top_k=2, expert_hidden=16)
    torch.manual_seed(0)
    model = TransformerLM(cfg, 40)
    tokens = torch.randint(3, 40, (5, 12), generator=torch.Generator().manual_seed(1))
    response = torch.zeros(5, 12, dtype=torch.bool)
    response[:, 7:] = True
    response[2, 10:] = False  # a row that stopped early
    full = model(tokens)
    want = gather_logprobs(full.logits / temperature, tokens)
    want_entropy = entropy_from_logits(full.logits)
    positions = head_positions(response, entropy=True)
    packed = model(tokens, logit_positions=positions)
    assert packed.logits.shape == (int(positions.sum()), 40)
    logp, lsm = packed_logprobs(packed.logits, tokens, positions, temperature)
    if temperature != 1.0:
        lsm = torch.log_softmax(packed.logits, -1)
    entropy = packed_entropy(lsm, positions)
    torch.testing.assert_close(logp[response], want[response], rtol=0, atol=2e-6)
    torch.testing.assert_close(entropy[response], want_entropy[response], rtol=0, atol=2e-6)
    # the gradient of a response-masked loss, through both paths
    grads = []
    for value in (
        (want * response).sum() + (want_entropy * response).sum(),
        (logp * response).sum() + (entropy * response).sum(),
    ):
        model.zero_grad()
        value.backward(retain_graph=True)
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_a_run_with_the_head_at_response_positions_tracks_the_full_one():
    from trainer.config import apply_overrides
    from trainer.config.presets import preset_dict
    from trainer.run.runner import train
    from trainer.run_folder.files import read_metrics
    from trainer.validation import validate_config

    metrics = {}
    for mode in ("full", "response"):
        cfg = validate_config(apply_overrides(preset_dict("moe-grpo"), [
            "run.steps=2", "run.eval_every=5", "warm_start.enabled=false", "run.threads=1",
            "rollout.prompts_per_step=4", "rollout.group_size=4", "algorithm.kl_coef=0.04",
            f'optim.logprobs="{mode}"', "optim.entropy_coef_start=0.01",
        ]))  # fmt: skip
        with tempfile.TemporaryDirectory() as tmp:
            train(cfg, Path(tmp), log=lambda *_: None)
            metrics[mode] = read_metrics(Path(tmp))
    for a, b in zip(metrics["full"], metrics["response"], strict=True):
        for key in ("policy/loss", "policy/entropy", "mismatch/kl_k3", "policy/grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-3, abs=1e-6), key
