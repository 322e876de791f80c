"""Native FP8 GEMMs (``torch._scaled_mm`` / ``torch._scaled_grouped_mm``) in the rollout
engine: equal to the emulated path up to bf16 output rounding, laid out as torch's CUDA
kernels demand, refused where a shape cannot run, chosen by capability, no host sync.

``torch._scaled_mm`` runs on the CPU (the native projections are exercised for
real here); ``torch._scaled_grouped_mm`` has no CPU kernel, so the expert tests
stand in a reference kernel (e4m3 products, fp32 accumulation, row-wise scales,
bf16 out). Every native call is first replayed on meta tensors, where torch's
meta kernels apply the CUDA checks (row-major first operand, column-major
second, K and N multiples of 16, scale shapes, int32 offsets): a layout an
H100 would reject fails here.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

import trainer.rollout.fp8 as fp8
from trainer.config import ModelConfig
from trainer.devices import capability as device_props
from trainer.devices.sync_count import count_syncs
from trainer.model import TransformerLM
from trainer.model.dispatch import Dispatch
from trainer.rollout import RolloutEngine
from trainer.rollout.fp8 import Fp8Experts, Fp8ShapeError, Fp8Weight, choose_fp8_plan, fp8_round
from trainer.rollout.numerics import Numerics

VOCAB = 24
U32, U_BF16 = 2.0**-24, 2.0**-8  # unit roundoff of fp32 and of bf16 (8 significant bits)


def _meta(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


@pytest.fixture
def kernels(monkeypatch) -> Counter:
    """Native GEMM calls checked against torch's CUDA rules (meta kernels) and
    counted; the grouped one served by a CPU reference."""
    calls: Counter = Counter()
    real_mm = torch._scaled_mm

    def scaled_mm(a, b, scale_a, scale_b, **kw):
        real_mm(*(_meta(t) for t in (a, b, scale_a, scale_b)), **kw)
        calls["scaled_mm"] += 1
        return real_mm(a, b, scale_a, scale_b, **kw)

    def scaled_grouped_mm(a, b, scale_a, scale_b, offs, out_dtype):
        metas = (_meta(t) for t in (a, b, scale_a, scale_b))
        torch._scaled_grouped_mm(*metas, offs=_meta(offs), out_dtype=out_dtype)
        calls["scaled_grouped_mm"] += 1
        out, start = torch.zeros(a.shape[0], b.shape[-1]), 0
        for e, end in enumerate(offs.tolist()):  # a host read: a reference, not the kernel
            acc = a[start:end].float() @ b[e].float()  # e4m3 products, fp32 sums
            out[start:end] = acc * scale_a[start:end, None] * scale_b[e]
            start = end
        return out.to(out_dtype)

    monkeypatch.setattr(fp8, "_scaled_mm", scaled_mm)
    monkeypatch.setattr(fp8, "_scaled_grouped_mm", scaled_grouped_mm)
    monkeypatch.setattr(fp8, "scaled_grouped_mm_runs", lambda *_: True)
    return calls


def _gemm_bound(x_hat: torch.Tensor, w_hat: torch.Tensor, y_emulated: torch.Tensor):
    """|native - emulated| allowed elementwise, for y = x_hat @ w_hat.T with K terms.

    Both paths multiply the SAME e4m3 operands and scales (one quantization
    formula). Their fp32 results differ only by rounding: the emulated one
    rounds each dequantized operand (q * s) and sums in MKL's order, the native
    one sums q_x q_w in its own order and scales after, so each is within
    gamma_(K+2) S of the exact sum, S = |x_hat| @ |w_hat|.T, gamma_n = n u / (1 - n u)
    with u = 2^-24: the two differ by at most 2 gamma S. Both are then rounded
    once to bf16 (u = 2^-8), which can land on neighbouring values when the two
    sums straddle a rounding boundary: 2^-8 (|p| + |q|) more, at most
    2^-7 |y| (1 + 2^-7) with |y| the emulated output.
    """
    k = x_hat.shape[-1]
    gamma = (k + 2) * U32 / (1 - (k + 2) * U32)
    s = x_hat.abs() @ w_hat.abs().t()
    return 2 * U_BF16 * y_emulated.abs() * (1 + 2 * U_BF16) + 2 * gamma * s * (1 + U_BF16)


@pytest.mark.parametrize("m,k,n", [(5, 32, 48), (64, 1024, 384), (64, 4096, 256)])
def test_native_linear_equals_emulated_within_bf16_rounding(kernels, m, k, n):
    gen = torch.Generator().manual_seed(k)
    x = torch.randn(m, k, generator=gen) * torch.logspace(-2, 1, k)  # uneven channels
    w = torch.randn(n, k, generator=gen) / k**0.5
    emulated, native = Numerics("fp8", fp8_gemm="emulated"), Numerics("fp8", fp8_gemm="native")
    w_emulated, w_native = emulated.gemm_weight(w), native.gemm_weight(w, "w")
    assert isinstance(w_native, Fp8Weight) and torch.equal(w_native.dequantize(), w_emulated)
    y_emulated = emulated.linear(x, w_emulated)
    y_native = native.linear(x, w_native)
    assert kernels["scaled_mm"] == 1 and y_native.dtype == torch.float32
    bound = _gemm_bound(fp8_round(x), w_emulated, y_emulated)
    assert ((y_native - y_emulated).abs() <= bound).all()
    # Another accumulation order (exact fp64 sums, one rounding) obeys the same bound:
    # what a GPU kernel's order may do. 3D input: the engine's (B, T, D) activations.
    exact = (fp8_round(x).double() @ w_emulated.double().t()).to(torch.bfloat16).float()
    assert ((exact - y_emulated).abs() <= bound).all()
    y3 = native.linear(x.view(1, m, k), w_native)
    assert y3.shape == (1, m, n) and torch.equal(y3[0], y_native)


def test_native_expert_gemm_equals_emulated_within_bf16_rounding(kernels):
    e, k, n, m = 4, 64, 32, 40
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(e, k, n, generator=gen) * torch.tensor([0.01, 1.0, 10.0, 0.1])[:, None, None]
    x = torch.randn(m, k, generator=gen)
    groups = Dispatch.from_indices(torch.randint(0, e, (m, 1), generator=gen), e)
    emulated, native = Numerics("fp8", fp8_gemm="emulated"), Numerics("fp8", fp8_gemm="native")
    assert native.fp8_mode == "native"  # the stand-in grouped kernel "runs" here
    w_emulated, w_native = emulated.expert_weights("w", w), native.expert_weights("w", w)
    assert isinstance(w_native, Fp8Experts) and torch.equal(w_native.dequantize(), w_emulated)
    rows = x.index_select(0, groups.token)
    y_emulated = emulated.expert_linear(emulated.expert_input(rows), w_emulated, groups, "loop")
    y_native = native.expert_linear(native.expert_input(rows), w_native, groups, "loop")
    assert kernels["scaled_grouped_mm"] == 1
    expert = torch.repeat_interleave(torch.arange(e), groups.counts)  # each sorted row's expert
    x_hat = fp8_round(rows)
    bound = torch.stack(
        [
            _gemm_bound(x_hat[i : i + 1], w_emulated[expert[i]].t(), y_emulated[i : i + 1])[0]
            for i in range(m)
        ]
    )
    assert ((y_native - y_emulated).abs() <= bound).all()


def test_native_weights_are_stored_in_the_layout_the_kernels_read():
    num = Numerics("fp8", fp8_gemm="native")
    w = torch.randn(48, 32)
    proj = num.gemm_weight(w, "proj")
    assert proj.data.dtype == torch.float8_e4m3fn and proj.data.shape == (48, 32)
    assert proj.data.t().stride() == (1, 32)  # (K, N) column-major: _scaled_mm's mat2
    assert proj.scale.shape == () and proj.scale == w.abs().max() / 448.0
    gate = torch.randn(3, 32, 16) * torch.tensor([1.0, 5.0, 0.5])[:, None, None]
    up = torch.randn(3, 32, 16) * 100.0
    fused = Numerics("fp8", fp8_gemm="emulated").expert_weights("gate|up", gate, up)
    num.fp8_experts = True  # as on sm90: experts native too
    native = num.expert_weights("gate|up", gate, up)
    assert native.data.shape == (3, 32, 32) and native.shape == (3, 32, 32)
    assert native.data.transpose(1, 2).stride()[1:] == (1, 32)  # column-major per expert
    # One scale per expert and per half (gate, up), repeated over that half's columns.
    assert torch.equal(native.scale[:, :16], (gate.abs().amax((1, 2)) / 448)[:, None].expand(3, 16))
    assert torch.equal(native.scale[:, 16:], (up.abs().amax((1, 2)) / 448)[:, None].expand(3, 16))
    assert torch.equal(native.dequantize(), fused)


def _model_and_tokens(cfg: ModelConfig, make_batch, seed: int = 0):
    torch.manual_seed(seed)
    model = TransformerLM(cfg, vocab_size=VOCAB).eval()
    tokens, mask = make_batch(VOCAB, [32, 20, 32, 9], 32, seed=seed + 1)
    return model, tokens, mask


def _engines(cfg: ModelConfig, model: TransformerLM, *modes: str) -> list[RolloutEngine]:
    out = []
    for mode in modes:
        precision = mode if mode in ("fp32", "bf16") else "fp8"
        fp8_gemm = mode if precision == "fp8" else "auto"
        engine = RolloutEngine(cfg, VOCAB, precision=precision, fp8_gemm=fp8_gemm)
        engine.load_weights(model.state_dict())
        out.append(engine)
    return out


SHARED = ModelConfig(
    n_layers=2, d_model=64, n_heads=4, n_experts=8, top_k=2, expert_hidden=32,
    shared_expert_hidden=48,
)  # fmt: skip


@pytest.mark.parametrize("cfg", [None, SHARED], ids=["tiny", "shared-expert"])
def test_forced_native_score_and_generate_are_close_to_emulated(
    kernels, tiny_moe_cfg, make_batch, cfg
):
    """Each native GEMM may differ from the emulated one by one bf16 ulp where the two
    fp32 sums straddle a rounding boundary (``_gemm_bound``): a few elements, a subset
    of the bf16 rounding a bf16 engine applies to EVERY activation. So the log-prob
    difference must stay under the bf16 engine's own gap to fp32, and routing may not
    flip more often than bf16 flips it (measured: native == emulated bit for bit on
    these shapes, both for this torch's CPU _scaled_mm and the reference grouped kernel)."""
    cfg = cfg or tiny_moe_cfg
    model, tokens, mask = _model_and_tokens(cfg, make_batch)
    fp32, bf16, emulated, native = _engines(cfg, model, "fp32", "bf16", "emulated", "native")
    assert (emulated.fp8_mode, native.fp8_mode) == ("emulated", "native")
    assert isinstance(native.layers[0].wqkv, Fp8Weight)
    assert isinstance(native.layers[0].experts_down, Fp8Experts)
    real = mask.clone()
    real[:, 0] = False
    ref, _ = fp32.score(tokens, mask)
    bf16_gap = (bf16.score(tokens, mask)[0] - ref)[real].abs().max()
    lp_emulated, route_emulated = emulated.score(tokens, mask)
    lp_native, route_native = native.score(tokens, mask)
    assert kernels["scaled_mm"] > 0 and kernels["scaled_grouped_mm"] > 0
    assert (lp_native - lp_emulated)[real].abs().max() <= bf16_gap
    for a, b in zip(route_native.unpack(), route_emulated.unpack(), strict=True):
        assert (a.sort(-1).values != b.sort(-1).values).any(-1)[mask].float().mean() <= 0.01

    prompt, prompt_mask = tokens[:, :8], mask[:, :8]
    batches = [
        engine.generate(prompt, prompt_mask, 12, generator=torch.Generator().manual_seed(3))
        for engine in (emulated, native)
    ]
    # Same draws and log-probs within the bound: the same tokens are sampled.
    assert torch.equal(batches[0].tokens, batches[1].tokens)
    live = batches[0].attention_mask
    assert (batches[1].logprobs - batches[0].logprobs)[live].abs().max() <= bf16_gap


def test_cpu_native_projections_run_with_emulated_experts_and_say_so(tiny_moe_cfg, make_batch):
    """The real CPU _scaled_mm, no stand-in: torch has no CPU grouped kernel, so the
    experts stay emulated and the mode says it."""
    model, tokens, mask = _model_and_tokens(tiny_moe_cfg, make_batch)
    fp32, bf16, emulated, native = _engines(
        tiny_moe_cfg, model, "fp32", "bf16", "emulated", "native"
    )
    assert native.fp8_mode == "native-dense+emulated-experts"
    assert isinstance(native.layers[0].wo, Fp8Weight)
    assert isinstance(native.layers[0].experts_gate_up, torch.Tensor)
    ref, _ = fp32.score(tokens, mask)
    bf16_gap = (bf16.score(tokens, mask)[0] - ref)[mask].abs().max()  # bound as above
    (lp_native, route_native), (lp_emulated, route_emulated) = (
        native.score(tokens, mask),
        emulated.score(tokens, mask),
    )
    assert (lp_native - lp_emulated)[mask].abs().max() <= bf16_gap
    assert route_native.routing_mask.equal(route_emulated.routing_mask)


def test_a_shape_the_kernels_cannot_take_is_refused_at_load(kernels, make_batch):
    cfg = ModelConfig(n_layers=1, d_model=40, n_heads=4, n_experts=4, top_k=2, expert_hidden=32)
    model, tokens, mask = _model_and_tokens(cfg, make_batch)
    with pytest.raises(Fp8ShapeError, match=r"blocks\.0\.attn\.qkv\.weight: .*multiple of 16"):
        _engines(cfg, model, "native")
    _engines(cfg, model, "emulated")[0].score(tokens, mask)  # emulation takes any shape
    # The refusal mirrors torch's own CUDA check on that GEMM (K = 40).
    a = torch.empty(8, 40, dtype=torch.float8_e4m3fn, device="meta")
    b = torch.empty(120, 40, dtype=torch.float8_e4m3fn, device="meta").t()
    scale = torch.empty((), device="meta")
    with pytest.raises(RuntimeError, match="divisible by 16"):
        torch._scaled_mm(a, b, scale, scale, out_dtype=torch.bfloat16)
    # An expert width of 24: gate|up (2 x 24 = 48 columns) could run, w_down (K = 24) not.
    cfg = ModelConfig(n_layers=1, d_model=32, n_heads=4, n_experts=4, top_k=2, expert_hidden=24)
    model, _, _ = _model_and_tokens(cfg, make_batch)
    with pytest.raises(Fp8ShapeError, match=r"blocks\.0\.ffn\.experts\.w_down: in features 24"):
        _engines(cfg, model, "native")


@pytest.mark.parametrize(
    "capability,mode,storage",
    [
        ((8, 0), "emulated", torch.float32),  # A100: no e4m3 kernels
        ((8, 9), "native-dense+emulated-experts", torch.bfloat16),  # L40 / Ada
        ((9, 0), "native", torch.bfloat16),  # H100 / H200
        ((10, 0), "native", torch.bfloat16),  # B200
        ((12, 0), "native-dense+emulated-experts", torch.bfloat16),  # no grouped kernel
    ],
)
def test_the_fp8_gemm_choice_follows_the_capability(monkeypatch, capability, mode, storage):
    monkeypatch.setattr(device_props, "device_capability", lambda device: capability)
    num = Numerics("fp8", "cuda")  # nothing is allocated: only the choice is made
    assert num.fp8_mode == mode and num.dtype == storage
    assert choose_fp8_plan("cuda", capability).label() == mode
    if mode == "emulated":
        with pytest.raises(ValueError, match="no e4m3 kernel on sm80"):
            Numerics("fp8", "cuda", fp8_gemm="native")
    assert Numerics("fp8", "cuda", fp8_gemm="emulated").fp8_mode == "emulated"


def test_cpu_defaults_to_emulation_and_native_is_opt_in():
    assert Numerics("fp8").fp8_mode == "emulated" and Numerics("fp8").dtype == torch.float32
    forced = Numerics("fp8", fp8_gemm="native")
    assert forced.fp8_mode == "native-dense+emulated-experts"
    assert forced.dtype == torch.float32  # CPU storage stays the emulated reference
    assert choose_fp8_plan("cpu", None, "native").gemms(moe=False) == {
        "projections": "native",
        "router": "bf16",
        "lm_head": "bf16",
    }
    assert choose_fp8_plan("cpu", None, "native").label(moe=False) == "native"
    with pytest.raises(ValueError, match="needs precision 'fp8'"):
        Numerics("bf16", fp8_gemm="native")
    with pytest.raises(ValueError, match="fp8_gemm must be one of"):
        Numerics("fp8", fp8_gemm="fast")


def test_native_decode_step_makes_no_sync(monkeypatch, tiny_moe_cfg, make_batch):
    """Quantizing, scaling and calling the kernels reads nothing on the host (the
    grouped stand-in here only checks its arguments: the reference loop syncs)."""

    def grouped(a, b, scale_a, scale_b, offs, out_dtype):
        torch._scaled_grouped_mm(
            *(_meta(t) for t in (a, b, scale_a, scale_b)), offs=_meta(offs), out_dtype=out_dtype
        )
        return torch.zeros(a.shape[0], b.shape[-1], dtype=out_dtype)

    monkeypatch.setattr(fp8, "_scaled_grouped_mm", grouped)
    monkeypatch.setattr(fp8, "scaled_grouped_mm_runs", lambda *_: True)
    model, tokens, _ = _model_and_tokens(tiny_moe_cfg, make_batch)
    (engine,) = _engines(tiny_moe_cfg, model, "native")
    assert engine.fp8_mode == "native"
    prompts, full = tokens[:, :6], torch.ones(4, 6, dtype=torch.bool)
    engine.generate(prompts, full, max_new_tokens=2, eos_id=None)  # cache, rope table
    with torch.inference_mode(), count_syncs() as syncs:
        n_real, key_bias = engine._decode_state(full, 8)
        routing = torch.zeros((engine.n_moe_layers, 4, 2), dtype=torch.uint8)
        engine.forward_pass.decode(prompts[:, -1], n_real, 6, key_bias[:, None, None, :7], routing)
    assert syncs.total == 0, syncs.report()
