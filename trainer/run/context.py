"""What every step of a run shares (``RunContext``) and how it is built (``build_context``).

``build_context`` makes the task, the supervised base policy (the warm start,
trainer/run/warmstart.py), the frozen reference, the rollout engine, the
updater with the run's stabilizers, the collapse detector and the random
streams; ``RunContext`` syncs the engine, evaluates and checkpoints.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trainer.analysis.collapse import CollapseDetector
from trainer.config import ExperimentConfig
from trainer.devices.packing import apply_memory_share, indexed_device
from trainer.devices.precision import cast_parameters
from trainer.devices.run_mode import phase_clock
from trainer.distributed import (
    SINGLE,
    DistContext,
    full_state_dict,
    local_optimizer_state,
    rank_device,
    rank_state_dict,
)
from trainer.hf.tokenizer import install_checkpoint_tokenizer
from trainer.model import TransformerLM
from trainer.model.expert_parallel import expert_shards
from trainer.rollout import RolloutEngine
from trainer.rollout.router_noise import build_router_noise
from trainer.run.checkpoint import (
    gather_objects,
    gather_rng_states,
    prune_sharded,
    rng_state,
    save_checkpoint,
    save_sharded,
)
from trainer.run.device_record import decode_choice
from trainer.run.evaluation import greedy_accuracy
from trainer.run.update import PolicyUpdater
from trainer.run.warmstart import missed_target, train_base_policy
from trainer.run_folder.warmstart_progress import WarmStartReporter
from trainer.tasks import Problem, Task, make_task


def resolve_device(name: str) -> torch.device:
    """``run.device`` as a torch device; CUDA always with its index (``cuda:0`` in a
    packed slot, which sees one device): torch's per-device calls refuse a bare
    ``cuda`` (trainer.devices.packing.indexed_device)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError("run.device is 'cuda' but no CUDA device is available")
    return indexed_device(name)


@dataclass
class RunState:
    step: int = 0
    accuracy_history: list[float] = field(default_factory=list)
    eval_history: list[tuple[int, float]] = field(default_factory=list)
    initial_accuracy: float | None = None
    wall_time_s: float = 0.0
    # The learning endpoint: held-out accuracy without the engine's gap (``evaluate_clean``).
    clean_eval_history: list[tuple[int, float]] = field(default_factory=list)
    initial_accuracy_clean: float | None = None
    # Routing inconsistency of the first steps: the run's measured dose (summary "dose").
    gap_history: list[float] = field(default_factory=list)


@dataclass
class RunContext:
    """What every step of a run shares, built once by ``_build``."""

    cfg: ExperimentConfig
    device: torch.device
    task: Task
    eval_problems: list[Problem]
    policy: TransformerLM
    reference: TransformerLM | None  # frozen, for the k3 KL; None when kl_coef == 0
    engine: RolloutEngine
    updater: PolicyUpdater  # owns the optimizer and the run's Stabilizers
    collapse: CollapseDetector
    py_rng: random.Random  # prompt draws
    generators: dict[str, torch.Generator]  # "sample": rollouts, "shuffle": minibatches
    state: RunState
    dist: DistContext = SINGLE
    # An engine without the run's gap (``clean_engine``); None when the rollout engine
    # has none (no router noise, the trainer's precision): it is clean itself.
    clean: RolloutEngine | None = None
    reward_timeouts_logged: int = 0  # reward calls over task.reward_timeout_s, already logged

    @property
    def sharded_checkpoint(self) -> bool:
        """FSDP checkpoints through torch.distributed.checkpoint, each rank its shards.
        With expert parallelism the ranks of a group hold different experts under
        the same parameter names, which one DCP folder cannot tell apart: those runs
        keep the whole model in last.pt and each rank's optimiser shard beside it."""
        return self.dist.fsdp and not self.dist.ep

    def sync_engine(self) -> float:
        """Load the policy's weights into the rollout engine; returns the seconds it took
        (metric ``time/weight_sync_s``). Under FSDP the shards are all-gathered first;
        under expert parallelism the engine keeps this rank's experts and exchanges
        rows with the group, as the training layers do (no gather)."""
        t0 = phase_clock(self.device)
        sync_weights(self.engine, self.policy, self.dist)
        return phase_clock(self.device) - t0

    def evaluate(self) -> float:
        """Held-out greedy accuracy through the rollout engine (the same way every time).
        Every rank evaluates the whole held-out set (greedy: the same answer on each)."""
        self.sync_engine()
        return greedy_accuracy(
            self.engine, self.task, self.eval_problems, self.cfg.rollout.max_new_tokens, self.device
        )

    def evaluate_clean(self) -> float:
        """Held-out greedy accuracy decoded without the engine's gap: the learning
        endpoint. A run's noisy or low-precision engine decodes the held-out set
        through its own routing flips, so ``evaluate`` mixes what the policy learned
        with the dose (at step 0 one base scores 0.293 at sigma 0 and 0.234-0.297 at
        sigma 0.4, by the projection); this engine routes as the trainer does."""
        if self.clean is None:
            return self.evaluate()
        sync_weights(self.clean, self.policy, self.dist)
        return greedy_accuracy(
            self.clean, self.task, self.eval_problems, self.cfg.rollout.max_new_tokens, self.device
        )

    def checkpoint_payload(self) -> dict[str, Any]:
        """What last.pt holds (a collective over several ranks: every rank calls it).

        Over several ranks it also records the world size and every rank's RNG
        (``rng_by_rank``); under FSDP the model and optimiser go to a sharded
        torch.distributed.checkpoint folder instead (trainer.run.checkpoint).
        """
        ep, dcp = self.dist.ep, self.sharded_checkpoint
        return {
            # Expert parallelism: the whole model, every rank's experts gathered.
            "policy": None if dcp else full_state_dict(self.policy, self.dist),
            "reference": (
                rank_state_dict(self.reference, self.dist)
                if self.reference is not None and not dcp
                else None
            ),
            "updater": self.updater.state_dict(),
            "collapse": self.collapse.state_dict(),
            "rng": rng_state(self.py_rng, self.generators),
            "rng_by_rank": gather_rng_states(self.dist, self.py_rng, self.generators),
            "optimizer_by_rank": (
                gather_objects(self.dist, local_optimizer_state(self.updater.optimizer))
                if ep
                else None
            ),
            "world_size": self.dist.world_size,
            "run_state": self.state.__dict__,
            "config": self.cfg.to_dict(),
        }

    def save(self, run_dir: Path) -> None:
        """Checkpoint the run; over several ranks every rank must call it (rank 0 writes)."""
        payload = self.checkpoint_payload()
        sharded = None
        if self.sharded_checkpoint:
            sharded = save_sharded(
                run_dir, self.state.step, self.policy, self.reference, self.updater.optimizer
            )
        if self.dist.is_main:
            save_checkpoint(run_dir, {**payload, "sharded": sharded})
            if sharded is not None:
                prune_sharded(run_dir, keep=sharded)
        self.dist.barrier()


def sync_weights(engine: RolloutEngine, policy: TransformerLM, dist: DistContext) -> None:
    """Load ``policy``'s weights into ``engine`` (all-gathered under FSDP; under expert
    parallelism the engine keeps this rank's experts)."""
    if dist.ep:
        if engine.expert_shard is None:  # the layout is fixed for the run
            engine.expert_shard = next(iter(expert_shards(policy).values()))
        engine.load_weights(rank_state_dict(policy, dist))
    else:
        engine.load_weights(full_state_dict(policy, dist))


# The engine precision that computes as the trainer does, by optim.param_dtype.
TRAINER_PRECISION = {"fp32": "fp32", "bf16": "bf16"}


def clean_engine(cfg: ExperimentConfig, vocab_size: int, device: torch.device):
    """An engine without the run's training-inference gap: the trainer's precision and
    no router noise (so it routes as the training forward does), for the learning
    endpoint; None when the run's own engine is already that."""
    precision = TRAINER_PRECISION[cfg.optim.param_dtype]
    noisy = cfg.model.is_moe and cfg.rollout.router_noise > 0
    if not noisy and cfg.rollout.precision == precision:
        return None
    return RolloutEngine(cfg.model, vocab_size, precision=precision, device=device)


# Rank r samples from seed + r * SAMPLE_SEED_STRIDE (rank 0: the single-process stream).
SAMPLE_SEED_STRIDE = 1_000_003


def build_context(
    cfg: ExperimentConfig,
    log: Callable[[str], None],
    run_dir: Path | None = None,
    interrupt: Callable[[], None] | None = None,
    dist: DistContext = SINGLE,
) -> RunContext:
    """Task, SFT base policy, frozen reference, rollout engine, updater, generators.
    ``interrupt`` is checked at every warm-start step (see ``Invocation.interrupt``).
    Every rank builds the same policy (same seed; the warm-start cache is shared)."""
    device = rank_device(resolve_device(cfg.run.device), dist)
    apply_memory_share(device)  # a packed slot's share of its GPU (trainer.devices.packing)
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    task = make_task(cfg.task)
    task.start()  # a custom reward function loads in its own process now, or a field error
    install_checkpoint_tokenizer(task, cfg)  # an imported model speaks its own tokens
    for name, report in task.data_report().items():  # file tasks: skipped rows, by reason
        log(
            f"task.{name}: {report['problems']} problems from {report['rows']} rows, "
            f"{report['bad_rows']} bad rows skipped {report['bad_row_reasons'] or ''}".rstrip()
        )
    vocab_size = cfg.model.vocab_size or task.tokenizer.vocab_size
    # The warm start reports its own phase (RUN_DIR/progress.json, trainer/run_folder/warmstart_progress.py).
    reporter = WarmStartReporter(
        run_dir,
        max_steps=cfg.warm_start.max_steps,
        target=cfg.warm_start.target_accuracy_low,
        log=log,
    )
    base = train_base_policy(
        cfg, task, vocab_size, device, log=log, reporter=reporter, interrupt=interrupt
    )
    log(
        f"base policy: held-out accuracy {base.accuracy:.3f} after {base.steps} SFT steps"
        + (" (cached)" if base.cached else "")
    )
    if (missed := missed_target(cfg, base.accuracy, base.steps)) is not None:
        log(f"WARNING: {missed}")
    torch.manual_seed(cfg.run.seed)
    value_head = cfg.algorithm.spec.has_value_head
    policy = TransformerLM(cfg.model, vocab_size, value_head=value_head).to(device)
    policy.set_moe_layer(cfg.run.moe_layer)  # the reference copy below inherits it
    # The SFT base has no value head: a fresh one is the only missing key allowed.
    policy.load_state_dict(base.state_dict, strict=not value_head)
    if not dist.fsdp:
        # bf16: fp32 masters in the updater. Under FSDP the fp32 shards are the
        # masters and the all-gathers cast to bf16 (trainer.distributed.shard_model).
        cast_parameters(policy, cfg.optim.param_dtype)
    reference = None
    if cfg.algorithm.kl_coef > 0:
        reference = copy.deepcopy(policy).eval().requires_grad_(False)
    generators = {
        # Each rank samples its own prompts' responses from its own stream (rank 0's
        # is the single-process one); the minibatch shuffle is global, the same on all.
        "sample": torch.Generator(device=device).manual_seed(
            cfg.run.seed + SAMPLE_SEED_STRIDE * dist.rank
        ),
        "shuffle": torch.Generator().manual_seed(cfg.run.seed + 1),
    }
    eval_problems = task.eval_set()
    return RunContext(
        cfg=cfg,
        device=device,
        task=task,
        eval_problems=eval_problems,
        policy=policy,
        reference=reference,
        engine=RolloutEngine(
            cfg.model,
            vocab_size,
            precision=cfg.rollout.precision,
            device=device,
            decode=decode_choice(cfg, device)[0],
            sampler=cfg.rollout.sampler,
            router_noise=build_router_noise(cfg, device, generators),
        ),
        # Builds the run's Stabilizers too (after the reference copy: noisy gating adds
        # noise-scale parameters to the policy's routers, never to the frozen reference).
        updater=PolicyUpdater(cfg, policy, reference, generators["shuffle"], dist=dist),
        collapse=CollapseDetector(
            cfg.run.collapse,
            samples=cfg.rollout.prompts_per_step * cfg.rollout.group_size,
            eval_samples=len(eval_problems),
        ),
        py_rng=random.Random(cfg.run.seed),
        generators=generators,
        state=RunState(initial_accuracy=base.accuracy),
        dist=dist,
        clean=clean_engine(cfg, vocab_size, device),
    )
