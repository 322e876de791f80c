"""``stabilizers``: one sub-section per owner (replay, balance, surgery, is_correction,
router_temperature, noisy_gating)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from trainer.config.section import Section


class RouterTemperatureConfig(Section):
    enabled: bool = Field(False, description="Adapt the router softmax temperature.")
    initial: float = Field(1.0, gt=0, le=100.0, description="Starting temperature.")
    interval: int = Field(
        1000, ge=1, description="Steps between controller checks (scale down for short runs)."
    )
    min_utilization: float = Field(
        0.75, ge=0.0, le=1.0, description="Below this expert utilization, cool down."
    )
    cool_factor: float = Field(0.9, gt=0, le=1.0, description="Multiplier when cooling.")
    heat_factor: float = Field(1.1, ge=1.0, le=10.0, description="Multiplier on monopoly.")
    monopoly_share: float = Field(
        3.0,
        gt=1.0,
        description="Monopoly when one expert's load exceeds this multiple of its fair share.",
    )
    min_temperature: float = Field(0.1, gt=0, description="Lower bound.")
    max_temperature: float = Field(10.0, gt=0, description="Upper bound.")


class ReplayConfig(Section):
    """Routing replay (owner: ``trainer.stabilizers.replay`` and the loop's replay masks)."""

    mode: Literal["none", "r2", "r3"] = Field(
        "none",
        description="none; r3 = replay the rollout engine's routing in training (arXiv "
        "2510.11370); r2 = replay the old policy's training routing in updates (GSPO).",
    )
    warmup_steps: int = Field(
        0, ge=0, description="Steps over which a share of pairs keeps its own routing."
    )
    warmup_keep_frac: float = Field(
        0.1,
        ge=0.0,
        le=1.0,
        description="Share of (token, layer) pairs keeping the training router's choice at "
        "step 0, shrinking linearly to 0 over warmup_steps.",
    )
    compression: Literal["none", "rle", "zlib"] = Field(
        "none", description="Extra compression of the bit-packed routing indices."
    )


class BalanceConfig(Section):
    """Load balancing and router anchoring (owner: ``trainer.algorithms.balance``)."""

    aux_loss_coef: float = Field(
        0.0, ge=0.0, le=10.0, description="Switch load-balancing loss alpha; e.g. 0.01."
    )
    aux_loss_scope: Literal["global", "sequence"] = Field(
        "global", description="Balance over the whole batch or per sequence."
    )
    z_loss_coef: float = Field(0.0, ge=0.0, le=10.0, description="Router z-loss; e.g. 1e-3.")
    aux_free_bias: bool = Field(
        False, description="DeepSeek-V3 auxiliary-loss-free balancing bias (selection only)."
    )
    aux_free_bias_rate: float = Field(1e-3, gt=0, le=1.0, description="Bias update speed u.")
    lb_from_natural_routing: bool = Field(
        True,
        description="Balance losses use the router's natural top-k even under replay "
        "(as Megatron does); off = use the replayed experts.",
    )
    router_kl_coef: float = Field(
        0.0, ge=0.0, le=100.0, description="Router-anchoring KL to recent routings; e.g. 0.1."
    )
    router_kl_buffer_steps: int = Field(
        4, ge=1, le=1000, description="Recent steps kept in the router-anchoring buffer."
    )

    @property
    def has_routing_loss(self) -> bool:
        return self.aux_loss_coef > 0 or self.z_loss_coef > 0 or self.router_kl_coef > 0


class SurgeryConfig(Section):
    """Gradient surgery (owner: ``trainer.stabilizers.surgery_step``)."""

    enabled: bool = Field(
        False, description="PCGrad projection of routing-loss gradient off the policy gradient."
    )
    scope: Literal["router", "all"] = Field(
        "router", description="Parameters on which gradient surgery acts."
    )


class ISCorrectionConfig(Section):
    """Training-inference importance-sampling correction (owner: ``algorithms.is_correction``)."""

    kind: Literal["none", "tis", "mis", "icepop"] = Field(
        "none",
        description="none; tis = truncated token weights; mis = mask sequences; "
        "icepop = zero tokens outside a ratio band.",
    )
    tis_cap: float = Field(2.0, gt=0, description="TIS truncation C.")
    mis_low: float = Field(0.5, gt=0, description="MIS lower bound on the sequence ratio.")
    mis_high: float = Field(2.0, gt=0, description="MIS upper bound on the sequence ratio.")
    icepop_low: float = Field(0.5, gt=0, description="IcePop lower token-ratio bound.")
    icepop_high: float = Field(5.0, gt=0, description="IcePop upper token-ratio bound.")

    @model_validator(mode="after")
    def _check_bounds(self) -> ISCorrectionConfig:
        if self.mis_low >= self.mis_high:
            raise ValueError("mis_low: mis_low must be < mis_high; lower mis_low")
        if self.icepop_low >= self.icepop_high:
            raise ValueError("icepop_low: icepop_low must be < icepop_high; lower icepop_low")
        return self


class NoisyGatingConfig(Section):
    """Noisy top-k gating (owner: ``trainer.model.noisy_gating``)."""

    enabled: bool = Field(
        False, description="Noisy top-k gating (learned softplus noise scale, training only)."
    )
    init_std: float = Field(
        0.1,
        gt=0,
        le=10.0,
        description="Initial noise std, in units of the router logits / T "
        "(a trained tiny router's top-2 gaps are of order 0.1-1).",
    )


class StabilizersConfig(Section):
    """The MoE stabilizers, one sub-section per owner."""

    replay: ReplayConfig = Field(default_factory=ReplayConfig)
    balance: BalanceConfig = Field(default_factory=BalanceConfig)
    surgery: SurgeryConfig = Field(default_factory=SurgeryConfig)
    is_correction: ISCorrectionConfig = Field(default_factory=ISCorrectionConfig)
    router_temperature: RouterTemperatureConfig = Field(default_factory=RouterTemperatureConfig)
    noisy_gating: NoisyGatingConfig = Field(default_factory=NoisyGatingConfig)
