"""``rollout``: the inference engine: sampling, precision, router noise, prompts per step."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from trainer.config.section import Section


class RolloutConfig(Section):
    precision: Literal["fp32", "bf16", "fp16", "fp8"] = Field(
        "bf16",
        description="Rollout engine precision. On CPU bf16/fp16 are emulated by rounding "
        "weights and activations around fp32 matmuls (as GPU GEMMs with fp32 accumulation). "
        "fp8: e4m3 weights and GEMM inputs with per-tensor scales, bf16 elsewhere: real e4m3 "
        "GEMMs where the GPU has them (sm89 projections, sm90 also the experts), emulated "
        "elsewhere; summary.json says which (trainer/rollout/fp8.py).",
    )
    prompts_per_step: int = Field(
        16, ge=1, le=65536, description="Prompts per RL step (before the batch-size ramp)."
    )
    group_size: int = Field(
        8, ge=1, le=1024, description="Responses sampled per prompt (the GRPO group)."
    )
    max_new_tokens: int = Field(16, ge=1, le=8192, description="Longest sampled response.")
    temperature: float = Field(1.0, gt=0, le=10.0, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0, le=1.0, description="Nucleus sampling mass; 1 = off.")
    sampler: Literal["inverse_cdf", "race"] = Field(
        "inverse_cdf",
        description="How a token is drawn from the (temperature, top-p) distribution: "
        "inverse_cdf, one uniform per row searched in the cumulative probabilities; race, "
        "the exponential race (torch.multinomial's algorithm, B x V draws per step). Same "
        "distribution, other tokens for the same seed: the studies run before inverse_cdf "
        "keep race (trainer/rollout/sampling.py).",
    )
    kv_cache: bool = Field(True, description="Decode with a KV cache (off = full recompute).")
    decode: Literal["auto", "eager", "compiled"] = Field(
        "auto",
        description="eager: the engine's decode step as written. compiled: a fixed-shape "
        "step (attention over a power-of-two bucket of the KV cache, the mask doing the "
        "work; trainer/rollout/static_decode.py) under torch.compile, one graph per "
        "bucket: captured as a CUDA graph on CUDA (mode reduce-overhead), inductor's C++ "
        "code on the CPU. Compiling costs tens of seconds per bucket once per process; "
        "an engine that stores fp32 runs its experts on the padded backend (grouped_mm "
        "compiles for bf16 only). Needs kv_cache; not with fp8 rollouts or expert "
        "parallelism. auto: compiled on CUDA for runs of at least 10,000 decode steps "
        "(run.steps x max_new_tokens) where it can run, eager otherwise; summary.json "
        "records the choice and why.",
    )
    router_noise: float = Field(
        0.0,
        ge=0.0,
        le=10.0,
        description="Routing-only training-inference gap: standard deviation (logit units) "
        "of a perturbation of the rollout engine's router selection scores before top-k; "
        "gates and every other path are unchanged (trainer/rollout/router_noise.py). "
        "0 = off. MoE only.",
    )
    router_noise_draw: Literal["base", "run"] = Field(
        "base",
        description="Whose seed draws the fixed router-noise projections. base: "
        "warm_start.seed, so every run on one base gets the same dose and a per-base "
        "calibration (python -m trainer calibrate) predicts each run's routing gap; "
        "run: run.seed, each run its own projection (the causal study of docs/results.md "
        "ran so: at sigma 0.2 its runs flipped 7.6-26.4% of routes).",
    )
    router_noise_kind: Literal["fixed", "fresh"] = Field(
        "fixed",
        description="fixed: a fixed function of the router input (one random projection "
        "per layer, as a deterministic kernel difference); fresh: new noise at every call.",
    )
