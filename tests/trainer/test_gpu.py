"""The CUDA paths on a real GPU (``-m gpu``; ``bench/device_check.py`` runs them).

Each test checks what only a device shows; the CPU suite counts or fakes it:

* host syncs: ``torch.cuda.set_sync_debug_mode("error")`` makes every
  device-to-host synchronisation raise. This is the ground truth behind the
  CPU's sync counter (trainer.devices.sync_count, tests/trainer/test_sync_count.py);
* the MoE backend ``auto`` picks on this capability (never the loop);
* CUDA fp32 log-probs against the CPU's, TF32 off;
* real FP8 GEMMs where the capability has them, against the emulated path;
* the compiled decode step (a CUDA graph) against the eager one;
* whole RL runs on CUDA (fp32 and bf16 parameters, fp8 rollouts), and
  ``run.deterministic`` runs that repeat and resume bit for bit.

Self-contained (no conftest fixtures): a GPU host may hold only the trainer's
dependencies, and the device check runs this file with ``--noconftest``.
"""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path

import pytest
import torch

from trainer.algorithms.losses import gather_logprobs
from trainer.config import apply_overrides
from trainer.config.presets import preset_dict, resolve_preset
from trainer.devices.capability import device_capability, has_fp8_gemm, has_fp8_grouped_gemm
from trainer.model import TransformerLM
from trainer.model.dispatch import resolve_backend
from trainer.rollout.engine import RolloutEngine
from trainer.run.runner import train
from trainer.run_folder.files import read_metrics
from trainer.validation import validate_config

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CUDA = torch.device("cuda", 0)
VOCAB = 64  # a multiple of 16: every GEMM of the tiny model may run native fp8


@contextlib.contextmanager
def no_host_sync():
    """Inside, any device-to-host synchronisation raises a RuntimeError."""
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


@contextlib.contextmanager
def tf32_off():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _tiny_moe(device=None, dtype=torch.float32):
    cfg = resolve_preset("moe-grpo").model
    torch.manual_seed(0)
    return cfg, TransformerLM(cfg, VOCAB).to(device or CUDA, dtype)


def _engine(precision: str, **kwargs) -> RolloutEngine:
    cfg, model = _tiny_moe()
    engine = RolloutEngine(cfg, VOCAB, precision=precision, device=CUDA, **kwargs)
    engine.load_weights(model.state_dict())
    return engine


def _prompts(batch: int = 5, length: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    prompts = torch.randint(3, VOCAB, (batch, length), generator=gen).to(CUDA)
    return prompts, torch.ones_like(prompts, dtype=torch.bool)


# --------------------------------------------------------------------------- host syncs
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("layer", ["fused", "reference"])
def test_moe_forward_and_backward_make_no_host_sync(dtype, layer):
    _, model = _tiny_moe(dtype=dtype)
    model.set_moe_layer(layer)
    tokens = torch.randint(3, VOCAB, (4, 12), device=CUDA)
    mask = torch.ones_like(tokens, dtype=torch.bool)
    mask[0, :4] = False  # a left-padded row

    def step():
        out = model(tokens, attention_mask=mask, return_routing=True)
        out.logits.float().square().mean().backward()

    step()  # lazy initialisation (cuBLAS handles, the allocator) is not the hot path
    with no_host_sync():
        step()


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp8"])
def test_a_decode_step_makes_no_host_sync(precision):
    engine = _engine(precision)
    prompts, mask = _prompts()
    engine.generate(prompts, mask, max_new_tokens=2, eos_id=None)  # cache, rope table
    with torch.inference_mode():
        n_real, key_bias = engine._decode_state(mask, 8)
        routing = torch.zeros((engine.n_moe_layers, 5, 2), dtype=torch.uint8, device=CUDA)
        with no_host_sync():
            engine.forward_pass.decode(
                prompts[:, -1], n_real, 6, key_bias[:, None, None, :7], routing
            )


def test_a_rollout_without_eos_makes_no_host_sync():
    """Without a stop token no row can stop early, so nothing is read back until the
    caller reads the batch (with one, the loop checks every ``stop_check_every``)."""
    engine = _engine("bf16")
    prompts, mask = _prompts()
    engine.generate(prompts, mask, max_new_tokens=12, eos_id=None)
    with no_host_sync():
        engine.generate(prompts, mask, max_new_tokens=12, eos_id=None)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_compiled_rollout_is_a_cuda_graph_and_makes_no_host_sync(precision):
    """The decode step captured once and replayed per token, the column advanced on
    the device. Inductor counts every graph it declines to capture (a step that
    writes an input it was not told is static, a CPU tensor, ...)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    engine = _engine(precision, decode="compiled")
    prompts, mask = _prompts()
    for _ in range(3):  # compile, record the graph, replay it
        engine.generate(prompts, mask, max_new_tokens=12, eos_id=None)
    with no_host_sync():
        engine.generate(prompts, mask, max_new_tokens=12, eos_id=None)
    assert counters["inductor"]["cudagraph_skips"] == 0


def test_a_bucketed_compiled_rollout_is_a_cuda_graph_per_bucket(monkeypatch):
    """Buckets of 8, 16 and 32 columns and the whole 34: a graph each, none skipped,
    the eager engine's greedy tokens, no host sync once captured."""
    from torch._dynamo.utils import counters

    from trainer.rollout import static_decode

    monkeypatch.setattr(static_decode, "BUCKET_MIN", 8)
    torch._dynamo.reset()
    counters.clear()
    eager, compiled = _engine("bf16"), _engine("bf16", decode="compiled")
    prompts, mask = _prompts(8, 6)
    want = eager.generate(prompts, mask, max_new_tokens=28, temperature=0.0, eos_id=None)
    for _ in range(3):  # compile, record, replay
        got = compiled.generate(prompts, mask, max_new_tokens=28, temperature=0.0, eos_id=None)
    with no_host_sync():
        compiled.generate(prompts, mask, max_new_tokens=28, eos_id=None)
    assert counters["inductor"]["cudagraph_skips"] == 0
    assert counters["stats"]["unique_graphs"] >= 4
    # bf16: the graph's fused kernels may round a near tie the other way late in a
    # rollout; the first tokens are the eager ones
    assert torch.equal(got.tokens[:, :12], want.tokens[:, :12])


def test_the_fused_moe_layer_is_as_accurate_as_the_reference_on_cuda():
    """bf16 at a width where grouped_mm's fused kernel runs (sm90): each layer's
    output and gradients against the fp64 computation on the CPU; the fused error at
    most the reference's plus a bf16 ulp of the largest value."""
    from trainer.model.moe import MoELayer

    torch.manual_seed(0)
    layer = MoELayer(256, 16, 4, 128)
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.05)
    x = torch.randn(2, 300, 256)
    grad = torch.randn(2, 300, 256)

    def run(module, dtype, device, kind):
        module = module.to(device, dtype)
        module.layer_kind = kind
        xi = x.to(device, dtype).requires_grad_(True)
        module.zero_grad()
        y, _ = module(xi)
        y.backward(grad.to(device, dtype))
        grads = [xi.grad, *(q.grad for q in module.parameters())]
        return [t.detach().double().cpu() for t in (y, *grads)]

    import copy

    exact = run(copy.deepcopy(layer), torch.float64, "cpu", "reference")
    ref = run(copy.deepcopy(layer), torch.bfloat16, CUDA, "reference")
    fused = run(copy.deepcopy(layer), torch.bfloat16, CUDA, "fused")
    for e, a, b in zip(exact, ref, fused, strict=True):
        ulp = e.abs().max().item() * 2**-7
        assert (b - e).abs().max() <= (a - e).abs().max() + ulp


# --------------------------------------------------------------------------- backends
def test_auto_backend_is_the_fused_kernel_where_it_exists_and_padded_elsewhere():
    major = device_capability(CUDA)[0]
    x = torch.zeros(4, 128, device=CUDA)
    assert resolve_backend("auto", x, (256,)) == "padded"  # no fp32 grouped GEMM on CUDA
    bf16 = resolve_backend("auto", x.bfloat16(), (256,))
    assert bf16 == ("grouped_mm" if major in (9, 10) else "padded")


# --------------------------------------------------------------------------- numerics
def test_cuda_fp32_logprobs_match_the_cpus():
    cfg, cpu_model = _tiny_moe(device="cpu")
    gpu_model = TransformerLM(cfg, VOCAB).to(CUDA)
    gpu_model.load_state_dict(cpu_model.state_dict())
    tokens = torch.randint(3, VOCAB, (8, 48), generator=torch.Generator().manual_seed(1))
    with tf32_off(), torch.no_grad():
        reference = gather_logprobs(cpu_model.eval()(tokens).logits, tokens)
        on_gpu = gather_logprobs(gpu_model.eval()(tokens.to(CUDA)).logits, tokens.to(CUDA))
    # Same formulas, other summation orders: fp32 rounding only.
    torch.testing.assert_close(on_gpu.cpu(), reference, rtol=0, atol=1e-4)


def test_fp8_rollouts_run_native_gemms_where_the_capability_has_them():
    capability = device_capability(CUDA)
    native, emulated = _engine("fp8"), _engine("fp8", fp8_gemm="emulated")
    if not has_fp8_gemm(capability):
        expected = "emulated"
    elif has_fp8_grouped_gemm(capability):
        expected = "native"
    else:
        expected = "native-dense+emulated-experts"
    assert native.fp8_mode == expected
    assert emulated.fp8_mode == "emulated"
    tokens, mask = _prompts(8, 32)
    a, _ = native.score(tokens, mask)
    b, _ = emulated.score(tokens, mask)
    # e4m3 products either way; native GEMMs write bf16, the emulated path fp32.
    assert (a - b).abs().max().item() < 0.05
    assert torch.isfinite(a).all()


def test_the_compiled_decode_step_samples_what_the_eager_one_does():
    eager, compiled = _engine("fp32"), _engine("fp32", decode="compiled")
    prompts, mask = _prompts(4, 8)
    first = eager.generate(prompts, mask, max_new_tokens=16, temperature=0.0, eos_id=None)
    second = compiled.generate(prompts, mask, max_new_tokens=16, temperature=0.0, eos_id=None)
    third = compiled.generate(prompts, mask, max_new_tokens=16, temperature=0.0, eos_id=None)
    assert torch.equal(first.tokens, second.tokens)
    assert torch.equal(second.tokens, third.tokens)  # the captured graph replays
    torch.testing.assert_close(second.logprobs, first.logprobs, rtol=0, atol=1e-4)


# --------------------------------------------------------------------------- whole runs
RUN = [
    "run.steps=3",
    "run.eval_every=2",
    "run.checkpoint_every=2",
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "algorithm.minibatches=2",
    "warm_start.enabled=false",
    "task.eval_size=16",
    "run.device=cuda",
]


def _cfg(extra: list[str] = ()):
    return validate_config(apply_overrides(preset_dict("moe-grpo"), [*RUN, *extra]))


def _comparable(rows: list[dict]) -> list[dict]:
    return [
        {k: v for k, v in r.items() if not k.startswith(("time/", "throughput/"))} for r in rows
    ]


@pytest.mark.parametrize(
    "extra",
    [[], ["optim.param_dtype=bf16"], ["rollout.precision=fp8"]],
    ids=["fp32", "bf16-params", "fp8-rollouts"],
)
def test_an_rl_run_trains_on_cuda(tmp_path: Path, extra):
    summary = train(_cfg(extra), tmp_path)
    assert summary["status"] == "succeeded", summary
    device = summary["device"]
    assert device["device"].startswith("cuda")
    assert device["timings"] == "synchronised at phase boundaries"
    assert "loop" not in device["moe_backend"].values()
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [0, 1, 2]
    for row in rows:
        for key, value in row.items():
            if isinstance(value, float):
                assert math.isfinite(value), (key, value)
        assert row["time/step_s"] > 0


def test_deterministic_runs_repeat_and_resume_bit_for_bit(tmp_path: Path):
    cfg = _cfg(["run.deterministic=true", "run.steps=4"])
    train(cfg, tmp_path / "a")
    train(cfg, tmp_path / "b")
    assert train(cfg, tmp_path / "r", stop_after=2)["status"] == "stopped"
    train(cfg, tmp_path / "r", resume=True)
    a, b, r = (_comparable(read_metrics(tmp_path / name)) for name in ("a", "b", "r"))
    assert [row["step"] for row in r] == [0, 1, 2, 3]
    assert a == b
    assert r == a


def test_eight_packed_runs_train_at_once_on_one_gpu(tmp_path: Path, monkeypatch):
    """A study with "parallel": 8 on one GPU: eight slot processes, each with an
    indexed device and an eighth of its memory (under MPS where the host has it),
    all finish (before the device index fix every one crashed before its first step)."""
    import json

    from trainer.studies.definition import StudyDefinition
    from trainer.studies.study import run_study

    monkeypatch.setenv("MOE_LAB_CACHE", str(tmp_path / "cache"))
    from trainer.devices.packing import parse_visible_devices

    visible = parse_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES", "")) or ["0"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible[0])  # one GPU, as this host numbers it
    study = StudyDefinition.from_dict({
        "name": "packed", "base": {"preset": "moe-grpo", "set": RUN}, "seeds": list(range(8)),
        "parallel": 8, "variants": [{"name": "moe"}],
    })  # fmt: skip
    run_study(study, tmp_path / "out")
    summaries = [
        json.loads(p.read_text()) for p in (tmp_path / "out").glob("moe/seed*/summary.json")
    ]
    assert len(summaries) == 8 and {s["status"] for s in summaries} == {"succeeded"}
    assert {s["device"]["device"] for s in summaries} == {"cuda:0"}
    assert {s["device"]["memory_share"] for s in summaries} == {0.125}
    assert len({s["device"]["mps"] for s in summaries}) == 1  # all clients, or none
