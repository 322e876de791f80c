"""Two gloo ranks train exactly what one process trains on the same global batch.

Same seed, same config, the same fixed rollout batch (rows sharded by whole
prompts): after one update (every minibatch of the batch) the loss, the other
step metrics and every parameter equal the single-process ones, for GRPO, PPO
(value head too) and GSPO, with R3 replay and with the balance losses on, under
DDP and FSDP2, and FSDP on a model imported from a Hugging Face checkpoint.

Tolerance: the ranks sum their shares of every loss in another order than one
process sums the whole batch, and the gradient all-reduce adds fp32 partial sums;
that moves gradients by a few ulps (~1e-7 relative). Adam divides by
sqrt(v) + eps, so a gradient element near eps (1e-8) turns that into a larger
change of its step, and four minibatch steps compound it. So every parameter
element agrees to ATOL = 5e-5, 5% of one lr-sized Adam step (lr 1e-3), and each
tensor's mean absolute difference to MEAN_ATOL = 1e-6, which a systematic
difference would exceed. Measured: up to 6e-6 on one machine; 1.6e-5 on another
(2 of the 16,384 elements of an imported model's expert up-projection, whose
gradients cancel to near zero). Losses and metrics agree to RTOL = 1e-5. Both are far below
the difference a per-rank (instead of global) loss normalisation makes (~1e-2
relative on the policy loss), which this test catches.

The batch is fixed rather than sampled because each rank samples its own
prompts' responses from its own stream (docs/distributed.md); the rollout engine
draws one stream per batch, so per-rank sampling cannot reproduce the
single-process draws.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from distributed_ranks import run_ranks

from trainer import metric_keys as K
from trainer.config import ExperimentConfig
from trainer.devices.precision import cast_parameters
from trainer.distributed import DistContext, full_state_dict
from trainer.hf import build_model, resolve_model_source
from trainer.rollout.data import RolloutData
from trainer.run.measure_step import measure_batch
from trainer.run.update import PolicyUpdater

ATOL = 5e-5
MEAN_ATOL = 1e-6
RTOL = 1e-5
PROMPTS, GROUP, PROMPT_LEN, RESPONSE_LEN = 4, 2, 5, 7
TINY_MOE = {"n_layers": 2, "d_model": 32, "n_heads": 4, "n_experts": 8, "top_k": 2,
            "expert_hidden": 16, "vocab_size": 40}  # fmt: skip

CASES = {
    "grpo": {"algorithm": {"name": "grpo"}},
    "ppo": {"algorithm": {"name": "ppo"}},
    "gspo": {"algorithm": {"name": "gspo", "loss_agg": "seq_mean"}},
    "grpo_r3": {"algorithm": {"name": "grpo"}, "stabilizers": {"replay": {"mode": "r3"}}},
    "grpo_balance": {
        "algorithm": {"name": "grpo", "loss_agg": "seq_mean"},
        "stabilizers": {"balance": {"aux_loss_coef": 0.01, "z_loss_coef": 0.001}},
    },
    "grpo_balance_seq_scope": {
        "algorithm": {"name": "grpo"},
        "stabilizers": {"balance": {"aux_loss_coef": 0.01, "aux_loss_scope": "sequence"}},
    },
}


def _config(
    case: dict, world: int, strategy: str, model: dict | None = None, ep: int = 1
) -> ExperimentConfig:
    data = {
        "model": model or TINY_MOE,
        "rollout": {"prompts_per_step": PROMPTS, "group_size": GROUP, "temperature": 1.0},
        "optim": {"lr": 1e-3, "warmup_steps": 0},
        "run": {"gpus": world, "seed": 0},
        "parallel": {"strategy": strategy, "expert_parallel": ep},
    }
    for section, fields in case.items():
        data[section] = {**data.get(section, {}), **fields}
    data["algorithm"] = {"minibatches": 4, "kl_coef": 0.04, **data["algorithm"]}
    return ExperimentConfig.model_validate(data)


def _global_batch(cfg: ExperimentConfig, vocab: int, moe_layers: int) -> RolloutData:
    """A fixed (B, T) rollout batch: left-padded prompts, responses of varied length,
    rewards that differ within groups, engine routing for R3 (seeded, so every rank
    builds the same one)."""
    gen = torch.Generator().manual_seed(123)
    b, t = PROMPTS * GROUP, PROMPT_LEN + RESPONSE_LEN
    tokens = torch.randint(3, vocab, (b, t), generator=gen)
    prompt_len = torch.randint(2, PROMPT_LEN + 1, (b,), generator=gen)
    response_len = torch.randint(1, RESPONSE_LEN + 1, (b,), generator=gen)
    pos = torch.arange(t)[None, :]
    prompt = (pos >= PROMPT_LEN - prompt_len[:, None]) & (pos < PROMPT_LEN)
    response = (pos >= PROMPT_LEN) & (pos < PROMPT_LEN + response_len[:, None])
    attention = prompt | response
    tokens = tokens.masked_fill(~attention, 0)
    rollout_logp = torch.where(response, -torch.rand(b, t, generator=gen) * 3 - 0.1, 0.0)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.2, 0.9])
    k, e = cfg.model.top_k, cfg.model.n_experts
    routing = [
        torch.rand(b, t, e, generator=gen).topk(k, dim=-1).indices for _ in range(moe_layers)
    ]
    return RolloutData(
        tokens=tokens,
        attention_mask=attention,
        response_mask=response,
        rollout_logp=rollout_logp,
        rewards=rewards,
        rollout_routing=routing,
        routing_mask=attention.clone(),
    )


def _shard(data: RolloutData, dist: DistContext) -> RolloutData:
    """This rank's whole prompts' rows of the global batch."""
    shard = dist.shard(PROMPTS)
    rows = slice(shard.start * GROUP, shard.stop * GROUP)
    return RolloutData(
        tokens=data.tokens[rows],
        attention_mask=data.attention_mask[rows],
        response_mask=data.response_mask[rows],
        rollout_logp=data.rollout_logp[rows],
        rewards=data.rewards[rows],
        rollout_routing=[r[rows] for r in data.rollout_routing],
        routing_mask=data.routing_mask[rows],
        global_offset=rows.start,
        global_size=data.batch_size,
    )


def _train_once(dist: DistContext, out_dir: Path, cfg: ExperimentConfig, tag: str) -> None:
    """Measure + one update (all minibatches) + controllers on this rank's share."""
    vocab = cfg.model.vocab_size
    torch.manual_seed(cfg.run.seed)
    policy = build_model(cfg.model, vocab, value_head=cfg.algorithm.spec.has_value_head)
    if not dist.fsdp:  # as the runner does: bf16 storage with fp32 masters in the updater
        cast_parameters(policy, cfg.optim.param_dtype)
    reference = copy.deepcopy(policy).eval().requires_grad_(False)
    updater = PolicyUpdater(cfg, policy, reference, torch.Generator().manual_seed(1), dist=dist)
    data = _shard(_global_batch(cfg, vocab, len(policy.moe_layers)), dist)
    metrics = updater.stabilizers.begin_step(0, data)
    metrics.update(measure_batch(cfg, policy, updater, data))
    metrics.update(updater.update(data, 0, lr=1e-3, entropy_coef=0.01))
    metrics.update(updater.stabilizers.end_step(0))
    state = {k: v.detach().float().clone() for k, v in full_state_dict(policy, dist).items()}
    # The weights the optimiser steps: bf16 parameters' fp32 masters in one process,
    # the fp32 shards themselves under FSDP.
    masters = state if dist.fsdp else {
        name: updater.masters.optimizer_param(param).detach().float().clone()
        for name, param in policy.named_parameters()
    }  # fmt: skip
    if dist.is_main:
        torch.save({"metrics": metrics, "state": state, "masters": masters}, out_dir / f"{tag}.pt")


def _compare(one: dict, two: dict) -> None:
    m1, m2 = one["metrics"], two["metrics"]
    assert set(m1) == set(m2)
    for key in (K.POLICY_LOSS, K.POLICY_GRAD_NORM, K.POLICY_ENTROPY, K.POLICY_KL_REF):
        assert m2[key] == pytest.approx(m1[key], rel=RTOL, abs=1e-7), key
    for key, value in m1.items():
        if isinstance(value, list | float):
            assert m2[key] == pytest.approx(value, rel=RTOL, abs=1e-6), key
    assert set(one["state"]) == set(two["state"])
    for name, p1 in one["state"].items():
        diff = (p1.float() - two["state"][name].float()).abs()
        assert float(diff.max()) <= ATOL, (name, float(diff.max()))
        assert float(diff.mean()) <= MEAN_ATOL, (name, float(diff.mean()))


def _run_pair(
    tmp_path: Path,
    case: dict,
    strategy: str,
    model: dict | None = None,
    world: int = 2,
    ep: int = 1,
):
    run_ranks(_train_once, 1, tmp_path, _config(case, 1, strategy, model), "w1")
    run_ranks(
        _train_once, world, tmp_path, _config(case, world, strategy, model, ep), "wN",
        strategy=strategy, expert_parallel=ep,
    )  # fmt: skip
    one, many = (torch.load(tmp_path / f"{t}.pt", weights_only=False) for t in ("w1", "wN"))
    _compare(one, many)
    return one, many


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_two_ddp_ranks_equal_one_process(tmp_path, name):
    one, _ = _run_pair(tmp_path, CASES[name], "ddp")
    # The update moved the weights (the comparison is not of two untouched models).
    assert one["metrics"][K.POLICY_GRAD_NORM] > 0
    if name == "ppo":
        assert K.VALUE_LOSS in one["metrics"]
        assert any(k.startswith("value_head.") for k in one["state"])
    if name.startswith("grpo_balance"):
        assert one["metrics"][K.LB_AUX_LOSS] > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["grpo", "ppo", "gspo", "grpo_r3", "grpo_balance"])
def test_two_fsdp_ranks_equal_one_process(tmp_path, name):
    one, _ = _run_pair(tmp_path, CASES[name], "fsdp")
    assert one["metrics"][K.POLICY_GRAD_NORM] > 0


@pytest.mark.slow
def test_fsdp_bf16_matches_the_single_process_bf16_run(tmp_path):
    """optim.param_dtype=bf16 under FSDP2 (fp32 shards as masters, bf16 all-gathers,
    fp32 gradient reduction) against one process's bf16 parameters with fp32 masters.

    Not to 1e-5: the all-gathered bf16 weights are views into FSDP's gather buffer,
    and bf16 matmuls on them round a few outputs differently by one bf16 ulp
    (measured: the first attention output differs by 3e-5, the logits by 4e-3 at
    the same weights); DDP's ranks use the cast parameters themselves and match
    the forward exactly. So the forward metrics agree to 1e-3 relative, the
    gradient norm to 1e-2, and the masters after four Adam steps are compared by
    their mean absolute difference: FSDP-bf16 must sit well inside the distance
    that switching the run to fp32 makes (measured 2.6e-5 vs 8.4e-5; DDP-bf16
    3.2e-6).
    """
    case = {"algorithm": {"name": "grpo"}, "optim": {"param_dtype": "bf16"}}
    run_ranks(_train_once, 1, tmp_path, _config(case, 1, "fsdp"), "w1")
    run_ranks(_train_once, 2, tmp_path, _config(case, 2, "fsdp"), "wN", strategy="fsdp")
    run_ranks(_train_once, 1, tmp_path, _config(CASES["grpo"], 1, "fsdp"), "fp32")
    one, two, fp32 = (
        torch.load(tmp_path / f"{t}.pt", weights_only=False) for t in ("w1", "wN", "fp32")
    )
    m1, m2 = one["metrics"], two["metrics"]
    for key in (K.MISMATCH_KL_K1, K.MISMATCH_KL_K3, K.EXPERTS_ROUTER_ENTROPY, K.POLICY_ENTROPY):
        assert m2[key] == pytest.approx(m1[key], rel=1e-3), key
    assert m2[K.POLICY_LOSS] == pytest.approx(m1[K.POLICY_LOSS], abs=2e-4)
    assert m2[K.POLICY_GRAD_NORM] == pytest.approx(m1[K.POLICY_GRAD_NORM], rel=1e-2)

    def mean_abs_diff(a: dict, b: dict) -> float:
        shared = [name for name in a["masters"] if name in b["masters"]]
        total = sum(float((a["masters"][n] - b["masters"][n]).abs().sum()) for n in shared)
        return total / sum(a["masters"][n].numel() for n in shared)

    assert mean_abs_diff(two, one) < 0.6 * mean_abs_diff(fp32, one)
    # Every weight moved by the update is an fp32 master (the shards) under FSDP.
    assert all(t.dtype == torch.float32 for t in two["masters"].values())


@pytest.mark.slow
def test_fsdp_shards_an_imported_hugging_face_model(tmp_path):
    from hf_tiny_checkpoints import save_hf_checkpoint

    folder = tmp_path / "hf"
    save_hf_checkpoint("qwen3_moe", folder)
    model = resolve_model_source(
        ExperimentConfig.model_validate({"model": {"source": str(folder)}})
    ).model
    one, _ = _run_pair(tmp_path, CASES["grpo"], "fsdp", model.model_dump())
    assert one["metrics"][K.POLICY_GRAD_NORM] > 0


@pytest.mark.slow
@pytest.mark.parametrize("family", ["deepseek_v3", "gpt_oss"])
@pytest.mark.parametrize(("strategy", "ep"), [("fsdp", 1), ("ddp", 2), ("fsdp", 2)])
def test_deepseek_and_gpt_oss_checkpoints_shard_and_split_their_experts(
    tmp_path, family, strategy, ep
):
    """FSDP2 and expert parallelism on imported DeepSeek-V3 (latent attention, sigmoid
    groups, the correction bias trained by the aux-free stabilizer) and GPT-OSS (sinks,
    expert biases split with their experts) checkpoints, with R3: two ranks train what
    one process does, the selection bias included.

    One optimiser step (one minibatch): these checkpoints' random weights put the
    fixed batch's importance ratios far from 1 (k3 to the rollout 2.3), so after the
    first Adam step (parameters within 5.6e-6 of one process's, measured) three more
    minibatches compound the ulp-level differences past RTOL; one step checks every
    gradient the sharding touches."""
    from hf_tiny_checkpoints import save_hf_checkpoint

    folder = tmp_path / "hf"
    save_hf_checkpoint(family, folder)
    model = resolve_model_source(
        ExperimentConfig.model_validate({"model": {"source": str(folder)}})
    ).model
    case = {
        "algorithm": {"name": "grpo", "minibatches": 1},
        "stabilizers": {"replay": {"mode": "r3"}, "balance": {"aux_free_bias": True}},
    }
    one, _ = _run_pair(tmp_path, case, strategy, model.model_dump(), ep=ep)
    assert one["metrics"][K.POLICY_GRAD_NORM] > 0
    assert one["metrics"][K.ROUTER_SELECTION_BIAS_SPREAD] > 0
    assert any(name.endswith("router.selection_bias") for name in one["state"])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "world"),
    [("grpo", 2), ("ppo", 2), ("gspo", 2), ("grpo_r3", 2), ("grpo_balance", 2), ("grpo", 4)],
)
def test_expert_parallel_ranks_equal_one_process(tmp_path, name, world):
    """EP=2: 2 ranks share each layer's experts; 4 ranks = 2 data-parallel x EP 2."""
    one, _ = _run_pair(tmp_path, CASES[name], "ddp", world=world, ep=2)
    assert one["metrics"][K.POLICY_GRAD_NORM] > 0


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "world"), [("grpo", 2), ("grpo_r3", 2), ("ppo", 2), ("grpo_balance", 4)]
)
def test_expert_parallel_under_fsdp_equals_one_process(tmp_path, name, world):
    """EP=2 with FSDP: each rank's experts are also sharded over the ranks holding the
    same experts (4 ranks = 2 data-parallel x EP 2), everything else over the world."""
    one, _ = _run_pair(tmp_path, CASES[name], "fsdp", world=world, ep=2)
    assert one["metrics"][K.POLICY_GRAD_NORM] > 0
