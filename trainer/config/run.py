"""``run``: steps, seed, devices, threads, collapse rule."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from trainer.config.section import Section


class CollapseConfig(Section):
    """docs/design.md, "collapse definition": non-finite loss/gradient, or a sustained accuracy
    drop beyond the batch noise (trainer/analysis/collapse.py justifies every default)."""

    window: int = Field(5, ge=1, le=1000, description="Running-median window of batch accuracy.")
    drop_fraction: float = Field(
        0.5,
        gt=0.0,
        lt=1.0,
        description="Collapse when the running median falls below this fraction of its best "
        "(and below the best by more than the noise margin).",
    )
    noise_z: float = Field(
        4.0,
        ge=0.0,
        le=20.0,
        description="Noise margin in standard deviations of the running median's difference "
        "(the larger of the binomial std at prompts_per_step x group_size answers and the run's "
        "own step-to-step noise).",
    )
    slow_window: int = Field(
        20,
        ge=0,
        le=10_000,
        description="Running-mean window of the slow scale that catches slow declines; 0 = off.",
    )
    patience: int = Field(3, ge=1, description="Steps the median must stay below the threshold.")
    recover_window: int = Field(
        20,
        ge=0,
        le=100_000,
        description="Steps after a collapse is flagged during which a recovery (or held-out "
        "accuracy within noise of its best) revokes it; 0 = every flag is final.",
    )


class RunConfig(Section):
    steps: int = Field(50, ge=1, le=10_000_000, description="RL steps to train.")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed of sampling and init.")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto picks CUDA when present."
    )
    threads: int = Field(0, ge=0, le=1024, description="CPU threads; 0 = torch default.")
    deterministic: bool = Field(
        False,
        description="Deterministic kernels: torch.use_deterministic_algorithms (an op without "
        "a deterministic kernel is an error), CUBLAS_WORKSPACE_CONFIG=:4096:8 on CUDA, cuDNN "
        "benchmark off; the same seed then gives the same run on the same hardware. Costs "
        "speed on GPUs; summary.json records the mode (docs/gpu.md).",
    )
    moe_layer: Literal["auto", "fused", "reference"] = Field(
        "auto",
        description="The training forward's routed experts: fused (one gate|up grouped GEMM, "
        "a fused SwiGLU, gathers instead of atomic scatter-adds in the backward; "
        "trainer/model/moe_fused.py) or reference (trainer/model/dispatch.py). auto: fused "
        "on CUDA, reference on the CPU. Plain SwiGLU experts only; others always run the "
        "reference. The same math; other summation orders.",
    )
    tf32: bool = Field(
        False,
        description="Allow TF32 matmuls and convolutions on CUDA (Ampere and later): faster "
        "fp32 GEMMs with a 10-bit mantissa, which changes the numerics of an fp32 run. Off, "
        "the run checks that TF32 is off before it starts.",
    )
    gpus: int = Field(
        1,
        ge=1,
        le=64,
        description="Ranks of the run on each node (GPUs; CPU processes on a CPU device); more "
        "than 1 launches torchrun with that many ranks training one run (the parallel section).",
    )
    nodes: int = Field(
        1,
        ge=1,
        le=64,
        description="Hosts the run spans, run.gpus ranks on each (world size nodes x gpus). "
        "More than 1 is gang-scheduled by the platform's queue on that many workers, joined "
        "by torchrun's c10d rendezvous; the trainer CLI needs torchrun --nnodes for it.",
    )
    eval_every: int = Field(10, ge=1, description="Steps between held-out evaluations.")
    checkpoint_every: int = Field(10, ge=1, description="Steps between checkpoints.")
    stop_on_collapse: bool = Field(False, description="End the run at the collapse step.")
    collapse: CollapseConfig = Field(default_factory=CollapseConfig)

    @property
    def world_size(self) -> int:
        """The run's ranks (trainer processes) in all: ``gpus`` on each of ``nodes`` hosts."""
        return self.gpus * self.nodes
