"""The root: ``ExperimentConfig`` holds every section and the checks across them."""

from __future__ import annotations

import hashlib
import json
import warnings
from typing import Any

from pydantic import Field, model_validator

from trainer.config.algorithm import AlgorithmConfig
from trainer.config.migration import migrate
from trainer.config.model import ModelConfig
from trainer.config.optim import OptimConfig
from trainer.config.parallel import _SINGLE_RANK_ONLY, ParallelConfig
from trainer.config.rollout import RolloutConfig
from trainer.config.run import RunConfig
from trainer.config.section import ConfigDeprecationWarning, Section
from trainer.config.stabilizers import StabilizersConfig
from trainer.config.task import ArithmeticTaskConfig, TaskConfig
from trainer.config.warm_start import WarmStartConfig


class ExperimentConfig(Section):
    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=ArithmeticTaskConfig)
    warm_start: WarmStartConfig = Field(default_factory=WarmStartConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    stabilizers: StabilizersConfig = Field(default_factory=StabilizersConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    run: RunConfig = Field(default_factory=RunConfig)
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)

    @model_validator(mode="before")
    @classmethod
    def _accept_old_shape(cls, data: Any) -> Any:
        """Rewrite the previous release's paths (``trainer.config.migration``) with a warning."""
        data, notes = migrate(data)
        for note in notes:
            warnings.warn(note, ConfigDeprecationWarning, stacklevel=2)
        return data

    @model_validator(mode="after")
    def _check_cross_section(self) -> ExperimentConfig:
        st = self.stabilizers
        moe_only = {
            "stabilizers.replay.mode": st.replay.mode != "none",
            "stabilizers.balance.aux_loss_coef": st.balance.aux_loss_coef > 0,
            "stabilizers.balance.z_loss_coef": st.balance.z_loss_coef > 0,
            "stabilizers.balance.router_kl_coef": st.balance.router_kl_coef > 0,
            "stabilizers.balance.aux_free_bias": st.balance.aux_free_bias,
            "stabilizers.noisy_gating.enabled": st.noisy_gating.enabled,
            "rollout.router_noise": self.rollout.router_noise > 0,
        }
        if not self.model.is_moe:
            on = [path for path, active in moe_only.items() if active]
            if on:
                raise ValueError(
                    f"{on[0]}: {', '.join(on)} need an MoE model; set model.n_experts > 0 or turn them off"
                )
        if self.algorithm.advantage.expert_zscore and (
            not self.model.is_moe
            or self.algorithm.advantage.expert_zscore_layer >= self.model.n_layers
        ):
            raise ValueError(
                "algorithm.advantage.expert_zscore: expert z-scored advantages need an MoE model and "
                "expert_zscore_layer < model.n_layers"
            )
        if getattr(self.task, "messages_field", None) and not self.model.chat_template:
            raise ValueError(
                "task.messages_field: a conversation is rendered by the checkpoint's chat "
                "template; set model.chat_template (and model.source) or use prompt_field"
            )
        if st.is_correction.kind != "none" and self.algorithm.behavior_logprobs == "rollout":
            # With rollout behaviour log-probs the clipped ratio is already
            # pi_theta / pi_rollout; TIS/MIS/IcePop would multiply by
            # pi_old / pi_rollout again and correct the engine gap twice (verl's
            # bypass mode applies no IS weight to such a ratio for this reason).
            raise ValueError(
                f"stabilizers.is_correction.kind: {st.is_correction.kind!r} reweights by "
                "pi_old / pi_rollout, but algorithm.behavior_logprobs='rollout' already puts "
                "pi_rollout in the ratio's denominator: the engine gap would be corrected "
                "twice; use behavior_logprobs='train' with an IS correction, or kind='none'"
            )
        if self.rollout.decode == "compiled":
            problem = None
            if not self.rollout.kv_cache:
                problem = "needs rollout.kv_cache=true (it is a cached decode step)"
            elif self.rollout.precision == "fp8":
                problem = "is not built for fp8 rollouts yet; use decode='eager'"
            elif self.parallel.expert_parallel > 1:
                problem = "cannot hold expert parallelism's all-to-all in a graph"
            if problem:
                raise ValueError(f"rollout.decode: 'compiled' {problem}")
        self._check_parallel()
        return self

    def _check_parallel(self) -> None:
        """Combinations of several ranks (run.gpus x run.nodes > 1) that cannot run, as
        field errors before any rank starts."""
        ranks = self.run.world_size
        ep = self.parallel.expert_parallel
        if ep > 1:
            problem = None
            if not self.model.is_moe:
                problem = "needs an MoE model; set model.n_experts > 0 or expert_parallel=1"
            elif self.model.n_experts % ep:
                problem = f"must divide model.n_experts={self.model.n_experts}"
            elif ranks % ep:
                problem = (
                    f"must divide the {ranks} ranks (run.gpus x run.nodes = data-parallel x {ep})"
                )
            if problem:
                raise ValueError(f"parallel.expert_parallel: {ep} {problem}")
        if ranks == 1:
            return
        if self.rollout.prompts_per_step < ranks:
            raise ValueError(
                f"rollout.prompts_per_step: {self.rollout.prompts_per_step} prompts cannot give "
                f"each of its {ranks} ranks (run.gpus x run.nodes) a prompt; raise it to >= {ranks} "
                "or lower run.gpus"
            )
        ramp = self.optim.batch_ramp_start
        if ramp is not None and ramp < ranks:
            raise ValueError(
                f"optim.batch_ramp_start: {ramp} prompts at step 0 cannot give each of "
                f"its {ranks} ranks (run.gpus x run.nodes) a prompt; raise it to >= {ranks}"
            )
        active = {
            "stabilizers.surgery.enabled": self.stabilizers.surgery.enabled,
            "stabilizers.balance.router_kl_coef": self.stabilizers.balance.router_kl_coef > 0,
            "algorithm.advantage.ema_decay": self.algorithm.advantage.ema_decay > 0,
            "algorithm.advantage.expert_zscore": self.algorithm.advantage.expert_zscore,
        }
        for path, on in active.items():
            if on:
                raise ValueError(
                    f"{path}: not supported with run.gpus > 1 ({_SINGLE_RANK_ONLY[path]}); "
                    "turn it off or set run.gpus=1"
                )
        if self.parallel.strategy == "fsdp" and self.optim.per_expert_grad_clip > 0:
            raise ValueError(
                "optim.per_expert_grad_clip: per-expert clipping needs whole expert gradients, "
                "which fsdp shards; set parallel.strategy=ddp or per_expert_grad_clip=0"
            )

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def hash(self, *sections: str) -> str:
        """Stable short hash of the given sections (all when none): keys caches."""
        data = self.to_dict()
        if sections:
            data = {name: data[name] for name in sections}
        blob = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]
