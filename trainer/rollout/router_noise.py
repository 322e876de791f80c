"""A routing-only training-inference gap: perturb the rollout engine's top-k choice.

Real inference engines route differently from the trainer because their
kernels (fused GEMMs, other reduction orders, half-precision logits) compute a
slightly different router score, and the top-k choice flips wherever two
experts are nearly tied. That difference is *deterministic*: the same input
gives the same flip every time. Lowering the rollout precision reproduces it,
but it also adds quantisation noise to every other GEMM, which a dense model
shares and routing replay (R3) cannot remove: the dose is then mostly not
routing (docs/results.md, "The causal study").

``rollout.router_noise = sigma`` isolates the routing part. The engine adds a
perturbation of standard deviation ``sigma`` (in logit units) to the router's
selection scores before top-k; the gates of the chosen experts still come from
the *unperturbed* probabilities, and every other path keeps the engine's
precision (fp32 for the causal study). So the only difference from the
trainer is which experts a token visits near a tie, exactly the gap that R3
replays away, and a dense model has no gap at all.

Two kinds:

* ``fixed`` (the default, a kernel-like emulation): the perturbation is a fixed
  function of the router input. Each MoE layer ``l`` draws once a projection
  ``P_l`` (E, D) with entries N(0, 1/D) from ``seed``; the score perturbation
  of a token with router input ``x`` (D,) is ``sigma * P_l (x / rms(x))``. Over
  the draw of ``P_l`` it has standard deviation exactly ``sigma`` per expert
  (||x / rms(x)||^2 = D), and the same token state always gets the same
  perturbation, as a kernel difference would.
* ``fresh``: independent N(0, sigma^2) noise at every call (a stochastic
  control: the same token may flip on one call and not the next).

The fixed projections are drawn from the *base's* seed (``warm_start.seed``,
``rollout.router_noise_draw = "base"``): every run on one base, whatever its
run seed, gets the same perturbation, so the dose is a property of (base,
sigma) that ``trainer.studies.calibration`` measures before any run and each
run's measured gap (summary.json ``dose``) can be checked against. With
``"run"`` each run seed draws its own projection (the causal study's runs:
at sigma 0.2 they flipped 7.6-26.4% of routes on the same bases).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from trainer.config import ExperimentConfig

KINDS = ("fixed", "fresh")
# Offsets the projection stream from the run's other seeded streams (sampling,
# shuffling, init) so that changing one never changes another.
_NOISE_SEED_OFFSET = 7_919


class RouterNoise:
    """The selection-score perturbation for every MoE layer of one engine.

    sigma: standard deviation in logit units (0 = off); kind: ``fixed`` or
    ``fresh``; d_model D and n_experts E size the projections; seed fixes them
    (and seeds the fresh stream unless ``generator`` is given).
    """

    def __init__(
        self,
        sigma: float,
        kind: str,
        n_moe_layers: int,
        d_model: int,
        n_experts: int,
        seed: int,
        device: torch.device | str = "cpu",
        generator: torch.Generator | None = None,
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"router noise kind must be one of {KINDS}, not {kind!r}")
        if sigma < 0:
            raise ValueError(f"router noise sigma must be >= 0, not {sigma}")
        self.sigma = float(sigma)
        self.kind = kind
        gen = torch.Generator().manual_seed(seed + _NOISE_SEED_OFFSET)
        if kind == "fixed":
            # (L_moe, D, E): drawn on the CPU so the perturbation does not depend
            # on the device's random stream, then moved.
            proj = torch.randn(n_moe_layers, d_model, n_experts, generator=gen) / d_model**0.5
            self.projections = (proj * self.sigma).to(device)
            self.generator = None
        else:
            # The run owns the stream (it is checkpointed with the run's other
            # generators, so a resumed run continues the same noise).
            self.projections = None
            self.generator = generator or torch.Generator(device=device).manual_seed(
                seed + _NOISE_SEED_OFFSET
            )

    @property
    def active(self) -> bool:
        return self.sigma > 0

    def perturb(self, scores: torch.Tensor, x: torch.Tensor, moe_layer: int) -> torch.Tensor:
        """scores: (N, E) fp32 selection scores; x: (N, D) router input of the
        same tokens. Returns the perturbed scores (N, E); only top-k reads them."""
        if not self.active:
            return scores
        if self.projections is not None:
            xf = x.float()
            unit = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-12)
            return scores + unit @ self.projections[moe_layer]
        noise = torch.randn(
            scores.shape, generator=self.generator, device=scores.device, dtype=scores.dtype
        )
        return scores + self.sigma * noise


def noise_seed(cfg: ExperimentConfig) -> int:
    """The seed of the fixed projections: the base's (``warm_start.seed``) by default,
    the run's with ``rollout.router_noise_draw = "run"``."""
    return cfg.warm_start.seed if cfg.rollout.router_noise_draw == "base" else cfg.run.seed


def build_router_noise(
    cfg: ExperimentConfig, device: torch.device, generators: dict[str, torch.Generator]
) -> RouterNoise | None:
    """The run's router noise from ``cfg.rollout`` (None when off). A fresh-noise
    stream is added to ``generators`` so the run checkpoints it with the others."""
    ro = cfg.rollout
    if ro.router_noise <= 0 or not cfg.model.is_moe:
        return None
    generator = None
    if ro.router_noise_kind == "fresh":
        # Fresh noise is a per-run stream (checkpointed with the run's generators).
        generator = torch.Generator(device=device).manual_seed(cfg.run.seed + _NOISE_SEED_OFFSET)
        generators["router_noise"] = generator
    return RouterNoise(
        ro.router_noise,
        ro.router_noise_kind,
        n_moe_layers=cfg.model.n_moe_blocks,
        d_model=cfg.model.d_model,
        n_experts=cfg.model.n_experts,
        seed=noise_seed(cfg),
        device=device,
        generator=generator,
    )
