"""The RL loop, readable top to bottom (in the spirit of cleanrl's ppo.py).

One step:
  1. rollout   - the rollout engine (its own precision, KV cache) samples
                 group_size responses per prompt and records log-probs and routing
  2. score     - verifiable rewards, accuracy
  3. measure   - ONE training forward on the rollout tokens (no grad) gives the
                 old log-probs, the training-inference mismatch (KL, extreme
                 tokens, routing inconsistency) and expert load
  4. advantage - GRPO/GSPO group-normalised, PPO GAE on a value head
  5. update    - several minibatches x epochs (off-policy), clipped objective,
                 k3 KL to the frozen reference, entropy bonus, routing losses;
                 then the routing controllers (aux-free bias, temperature)
  6. record    - metrics.jsonl line, collapse check, eval, checkpoint

SIGTERM finishes the current step, checkpoints and ends with status cancelled
(during the warm start: at the next SFT step, status cancelled, no checkpoint).

Started by torchrun (run.gpus > 1), every rank runs this loop on its share of
the step's prompts and every statistic is reduced over the ranks; rank 0 alone
writes the run folder (trainer/distributed/, docs/distributed.md).
The trainer holds the run folder's lock for its whole life and, under a
supervisor, stops without a checkpoint once its lease expires
(trainer/run_folder/guard.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainer import metric_keys as K
from trainer.analysis.collapse import CollapseDetector
from trainer.analysis.run_record import GAP_STEPS
from trainer.config import ExperimentConfig
from trainer.devices.environment import code_record
from trainer.devices.run_mode import numerics_mode, phase_clock
from trainer.distributed import (
    SINGLE,
    DistContext,
    init_distributed,
    load_local_optimizer_state,
    load_rank_state_dict,
    rank_device,
    shutdown_distributed,
)
from trainer.errors import FieldError
from trainer.hf.loader import resolve_model_source
from trainer.model.expert_parallel import expert_shards, slice_expert_shards
from trainer.rollout.data import RolloutData
from trainer.run.batches import collate_prompts, decode_responses, repeat_for_groups
from trainer.run.checkpoint import (
    check_world_size,
    load_checkpoint,
    load_sharded,
    restore_rng,
)
from trainer.run.context import (
    RunContext,
    RunState,
    build_context,
    resolve_device,
)
from trainer.run.measure_step import measure_batch
from trainer.run.progress import Progress
from trainer.run.schedules import entropy_coef_at, lr_at, prompts_at
from trainer.run.stop import StopFlag, StopRequested
from trainer.run.summary import run_summary
from trainer.run_folder.files import CONFIG_FILE, SUMMARY_FILE, MetricsWriter, write_json_atomic
from trainer.run_folder.guard import Lease, LeaseExpired, RunDirLock


@dataclass
class Invocation:
    """One call of ``train``: where the run goes and how this call may end."""

    cfg: ExperimentConfig
    run_dir: Path
    resume: bool
    stop_after: int | None  # end this call after that many steps (status "stopped")
    stop: StopFlag  # SIGTERM/SIGINT asked to end after the current step
    progress: Progress
    log: Callable[[str], None]
    t_start: float
    lease: Lease  # renewed by the supervisor; never expires without one
    dist: DistContext = SINGLE
    # time.time() by which this call ends (a study's time budget): it stops at the
    # last step boundary before it, with a checkpoint (status "stopped")
    stop_at: float | None = None

    def past_deadline(self, margin_s: float = 0.0) -> bool:
        return self.stop_at is not None and time.time() + margin_s >= self.stop_at

    def interrupt(self) -> None:
        """Raise when this call must stop now: an expired lease, a stop request or
        its deadline (``stop_at``)."""
        self.lease.check()
        if self.stop.requested or self.past_deadline():
            raise StopRequested


def train(
    cfg: ExperimentConfig,
    run_dir: Path,
    *,
    resume: bool = False,
    stop_after: int | None = None,
    log=None,
    lease: Lease | None = None,
    stop_at: float | None = None,
) -> dict[str, Any]:
    """Train one run into ``run_dir``; returns the summary (also in summary.json).

    ``stop_after`` ends this invocation after that many steps with a checkpoint
    (status "stopped"), so a later ``resume`` continues the same run; so does
    ``stop_at`` (a ``time.time()`` deadline: the call ends at the last step
    boundary before it, or in the warm start, whose state is kept). The run
    folder is locked for the whole call (``RunDirBusy`` when another trainer
    holds it); ``lease`` raises ``LeaseExpired`` once the supervisor stops
    renewing it, leaving no checkpoint and no summary behind.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    # The code this process runs is what it imported: hash it now, not when the summary
    # is written hours later (the checkout may have moved on; code_record is cached).
    code_record()
    # torchrun's ranks join one process group; without torchrun this is SINGLE.
    dist = init_distributed(
        cfg.run.world_size,
        resolve_device(cfg.run.device),
        cfg.parallel.strategy,
        cfg.parallel.timeout_s,
        cfg.parallel.expert_parallel,
    )
    # Rank 0 owns the run folder: its lock, its log and progress lines.
    with RunDirLock(run_dir) if dist.is_main else contextlib.nullcontext():
        quiet = None if dist.is_main else open(os.devnull, "w")  # noqa: SIM115
        progress = Progress(cfg.run.steps, stream=quiet)
        inv = Invocation(
            cfg,
            run_dir,
            resume,
            stop_after,
            StopFlag(),
            progress,
            (log or progress.message) if dist.is_main else progress.message,
            time.perf_counter(),
            lease or Lease(None, 0),
            dist,
            stop_at,
        )
        inv.stop.install()
        finished = False
        try:
            with numerics_mode(cfg, rank_device(resolve_device(cfg.run.device), dist)):
                summary = _train(inv)
            finished = True
            return summary
        finally:
            inv.stop.uninstall()
            progress.close()
            if quiet is not None:
                quiet.close()
            shutdown_distributed(dist, in_step=finished)


def _train(inv: Invocation) -> dict[str, Any]:
    # model.source: the shape comes from the checkpoint's config.json (docs/models.md)
    cfg = inv.cfg = resolve_model_source(inv.cfg)
    main = inv.dist.is_main
    if main:
        (inv.run_dir / CONFIG_FILE).write_text(json.dumps(cfg.to_dict(), indent=2, sort_keys=True))
    try:
        ctx = build_context(cfg, inv.log, inv.run_dir if main else None, inv.interrupt, inv.dist)
    except StopRequested:  # stopped during the warm start: nothing to checkpoint yet
        collapse = CollapseDetector(cfg.run.collapse)
        status = "stopped" if inv.past_deadline() and not inv.stop.requested else "cancelled"
        summary = run_summary(cfg, RunState(), collapse, status, time.perf_counter() - inv.t_start)
        if main:
            write_json_atomic(inv.run_dir / SUMMARY_FILE, summary)
        return summary
    resume_step = _restore_or_measure_start(ctx, inv)
    metrics_out = MetricsWriter(inv.run_dir, resume_from_step=resume_step) if main else None
    inv.progress.begin(ctx.state.step)
    try:
        status = _loop(ctx, inv, metrics_out)
        inv.lease.check()
        ctx.save(inv.run_dir)
    except LeaseExpired:
        raise  # another attempt may own the run now: write nothing more
    except Exception as exc:
        summary = run_summary(
            cfg, ctx.state, ctx.collapse, "failed", time.perf_counter() - inv.t_start
        )
        summary["error"] = _error_text(exc, inv.dist)
        if main:
            write_json_atomic(inv.run_dir / SUMMARY_FILE, summary)
        raise
    finally:
        if metrics_out is not None:
            metrics_out.close()
        ctx.task.close()  # a custom reward function's process
    summary = run_summary(cfg, ctx.state, ctx.collapse, status, ctx.state.wall_time_s)
    summary.update({"task_data": ctx.task.data_report()} if ctx.task.data_report() else {})
    if ctx.task.reward_timeouts():
        summary["reward_timeouts"] = ctx.task.reward_timeouts()
    if main:
        write_json_atomic(inv.run_dir / SUMMARY_FILE, summary)
    return summary


def _restore_or_measure_start(ctx: RunContext, inv: Invocation) -> int | None:
    """Resume from the checkpoint (returns the last step kept in metrics.jsonl), or
    measure the starting policy (returns None: a fresh metrics.jsonl)."""
    ckpt = load_checkpoint(inv.run_dir) if inv.resume else None
    if ckpt is None:
        # Measured the way every later evaluation is, so final - initial is fair.
        ctx.state.initial_accuracy = ctx.evaluate()
        ctx.state.initial_accuracy_clean = (
            ctx.evaluate_clean() if ctx.clean is not None else ctx.state.initial_accuracy
        )
        return None  # also a resume without a checkpoint: start over
    check_world_size(ckpt, ctx.dist)
    if ckpt.get("sharded"):
        load_sharded(inv.run_dir, ckpt["sharded"], ctx.policy, ctx.reference, ctx.updater.optimizer)
    else:
        policy_state = ckpt["policy"]
        if ctx.dist.ep:  # this rank's slices of the gathered experts
            policy_state = slice_expert_shards(policy_state, expert_shards(ctx.policy))
        load_rank_state_dict(ctx.policy, policy_state, ctx.dist)
        if ctx.reference is not None and ckpt.get("reference") is not None:
            load_rank_state_dict(ctx.reference, ckpt["reference"], ctx.dist)
    ctx.updater.load_state_dict(ckpt["updater"])
    if ckpt.get("optimizer_by_rank"):
        load_local_optimizer_state(ctx.updater.optimizer, ckpt["optimizer_by_rank"][ctx.dist.rank])
    ctx.collapse.load_state_dict(ckpt["collapse"])
    by_rank = ckpt.get("rng_by_rank")
    restore_rng(by_rank[ctx.dist.rank] if by_rank else ckpt["rng"], ctx.py_rng, ctx.generators)
    ctx.state = RunState(**ckpt["run_state"])
    inv.log(f"resumed from the checkpoint at step {ctx.state.step}")
    return ctx.state.step - 1


def _loop(ctx: RunContext, inv: Invocation, metrics_out: MetricsWriter | None) -> str:
    """Steps until done, collapse (if it stops the run), a stop request or stop_after."""
    cfg, state = ctx.cfg, ctx.state
    steps_this_call = 0
    t_segment = time.perf_counter()
    wall_before = state.wall_time_s
    while state.step < cfg.run.steps:
        step = state.step
        inv.lease.check()
        t_step = time.perf_counter()
        metrics = _rl_step(ctx, step)
        _record(ctx, inv, step, metrics)
        inv.lease.check()  # a step can outlast the lease: never write a lost attempt's step
        if metrics_out is not None:
            metrics_out.write(step, metrics)
        state.step = step + 1
        steps_this_call += 1
        state.wall_time_s = wall_before + time.perf_counter() - t_segment
        inv.progress.update(
            step,
            {"acc": metrics[K.REWARD_ACCURACY], "kl_k3": metrics.get(K.MISMATCH_KL_K3, 0.0)},
        )
        if ctx.collapse.collapsed and cfg.run.stop_on_collapse:
            break
        # SIGTERM reaches every rank, not always during the same step: all agree.
        if ctx.dist.any_true(inv.stop.requested):
            return "cancelled"
        if inv.stop_after is not None and steps_this_call >= inv.stop_after:
            return "stopped"
        # The next step would end past the deadline (it takes about as long as this
        # one, evaluation included): stop here, with a checkpoint.
        if state.step < cfg.run.steps and inv.past_deadline(time.perf_counter() - t_step):
            return "stopped"
        if state.step % cfg.run.checkpoint_every == 0:
            inv.lease.check()
            ctx.save(inv.run_dir)
    return "succeeded"


def _record(ctx: RunContext, inv: Invocation, step: int, metrics: dict[str, Any]) -> None:
    """6. record: batch accuracy, held-out evaluation when due, collapse check."""
    cfg = ctx.cfg
    finite = bool(metrics.pop("_finite"))
    if not finite and step == 0:
        # Nothing was learned yet: the starting weights (or a config that overflows
        # at once) make the loss undefined. That is a failed run, not a collapse.
        where = "model.source" if cfg.model.source != "builtin" else "optim.lr"
        raise FieldError(
            [
                (
                    where,
                    "the loss or gradient is not finite at the first step (policy/loss "
                    f"{metrics.get(K.POLICY_LOSS)}): NaN or Inf in the starting weights, or a "
                    "config that overflows at once; the run failed before training, it did "
                    "not collapse",
                )
            ]
        )
    acc = metrics[K.REWARD_ACCURACY]
    ctx.state.accuracy_history.append(acc)
    gap = metrics.get(K.MISMATCH_ROUTING_INCONSISTENCY)
    if gap is not None and len(ctx.state.gap_history) < GAP_STEPS:
        ctx.state.gap_history.append(float(gap))
    if step % cfg.run.eval_every == 0 or step == cfg.run.steps - 1:
        eval_acc = ctx.evaluate()
        metrics[K.EVAL_ACCURACY] = eval_acc
        ctx.state.eval_history.append((step, eval_acc))
        # The learning endpoint (no engine gap); the same number when the engine has none.
        clean_acc = ctx.evaluate_clean() if ctx.clean is not None else eval_acc
        metrics[K.EVAL_ACCURACY_CLEAN] = clean_acc
        ctx.state.clean_eval_history.append((step, clean_acc))
    samples = int(metrics.get(K.OPTIM_BATCH_SIZE, 0)) or None  # answers this step
    if K.EVAL_ACCURACY in metrics:
        ctx.collapse.update_eval(step, metrics[K.EVAL_ACCURACY])
    if ctx.collapse.update(step, acc, finite=finite, samples=samples):
        inv.log(f"collapse at step {ctx.collapse.collapse_step}: {ctx.collapse.collapse_reason}")
    timeouts = ctx.task.reward_timeouts()
    if timeouts > ctx.reward_timeouts_logged:
        inv.log(
            f"step {step}: {timeouts - ctx.reward_timeouts_logged} reward call(s) ran over "
            f"task.reward_timeout_s={getattr(cfg.task, 'reward_timeout_s', 0):g} s and scored 0 "
            f"({timeouts} in this attempt)"
        )
        ctx.reward_timeouts_logged = timeouts


def _rl_step(ctx: RunContext, step: int) -> dict[str, Any]:
    """One RL step (1-5 of the module docstring); returns its metrics (plus ``_finite``)."""
    cfg, task, device, dist = ctx.cfg, ctx.task, ctx.device, ctx.dist
    # Phase boundaries wait for the device on CUDA: time/* is the device's work.
    t0 = phase_clock(device)
    tok = task.tokenizer

    # 1. rollout: the engine gets this step's weights, as vLLM gets a weight sync.
    #    Every rank draws the same global prompts and rolls out its own share,
    #    whole groups (GRPO's advantages stay within a rank).
    n_prompts = prompts_at(step, cfg.rollout, cfg.optim)
    shard = dist.shard(n_prompts)
    group = cfg.rollout.group_size
    problems = repeat_for_groups(task.sample(n_prompts, ctx.py_rng)[shard], group)
    prompts, prompt_mask = collate_prompts(problems, tok, device)
    weight_sync_s = ctx.sync_engine()
    rollout = ctx.engine.generate(
        prompts,
        prompt_mask,
        max_new_tokens=cfg.rollout.max_new_tokens,
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        eos_id=tok.stop_ids,
        pad_id=tok.pad_id,
        generator=ctx.generators["sample"],
        use_kv_cache=cfg.rollout.kv_cache,
        score_prompt=False,  # the step reads response log-probs only
    )
    t_rollout = phase_clock(device)

    # 2. score: verifiable rewards.
    texts = decode_responses(rollout.tokens, rollout.response_mask, tok)
    scored = task.score(problems, texts)  # one batch: a custom reward runs in its own process
    rewards = torch.tensor([reward for reward, _ in scored])
    correct = torch.tensor([float(right) for _, right in scored])
    # The engine's routing travels bit-packed (stabilizers.replay.compression).
    data = RolloutData.from_rollout(rollout, rewards.to(device), cfg.stabilizers.replay.compression)
    data.global_offset, data.global_size = shard.start * group, n_prompts * group

    # 3. measure: one training forward on the rollout tokens, before any update
    #    (R3 replays the engine's routing there; the step's replay mask comes first).
    stabilizers = ctx.updater.stabilizers
    metrics = stabilizers.begin_step(step, data)
    metrics.update(measure_batch(cfg, ctx.policy, ctx.updater, data))
    t_measure = phase_clock(device)

    # 4-5. advantages and the off-policy update, then the routing controllers
    #      (aux-free bias, router-anchor buffer, temperature) act on the step's loads.
    lr = lr_at(step, cfg.run.steps, cfg.optim)
    entropy_coef = entropy_coef_at(step, cfg.run.steps, cfg.optim)
    metrics.update(ctx.updater.update(data, step, lr=lr, entropy_coef=entropy_coef))
    metrics.update(stabilizers.end_step(step))
    t_train = phase_clock(device)

    # Sums and counts over every rank's samples (a rank's mean weighs its rows).
    rows = float(len(problems))
    metrics.update(
        dist.weighted_means(
            {
                K.REWARD_MEAN: (rewards.mean().item(), rows),
                K.REWARD_ACCURACY: (correct.mean().item(), rows),
                K.RESPONSE_LENGTH_MEAN: (
                    rollout.response_mask.sum(1).float().mean().item(),
                    rows,
                ),
            }
        )
    )
    n_response_tokens = float(dist.sum(rollout.response_mask.sum().reshape(1))[0])
    metrics.update(
        {
            K.OPTIM_LR: lr,
            K.OPTIM_BATCH_SIZE: float(n_prompts * group),
            K.TIME_WEIGHT_SYNC_S: weight_sync_s,
            K.OPTIM_ENTROPY_COEF: entropy_coef,
            K.TIME_ROLLOUT_S: t_rollout - t0,
            K.TIME_MISMATCH_S: t_measure - t_rollout,
            K.TIME_TRAIN_S: t_train - t_measure,
            K.TIME_STEP_S: t_train - t0,
            K.TIME_WALL: time.time(),  # the wall-clock axis of the run's charts
            K.THROUGHPUT_TOKENS_PER_S: n_response_tokens / max(t_rollout - t0, 1e-9),
        }
    )
    return metrics


def _error_text(exc: Exception, dist: DistContext) -> str:
    """The summary's error; over several ranks it says when a peer rank died or
    stopped answering (a collective failed or timed out), not just the backend's words."""
    text = f"{type(exc).__name__}: {exc}"
    if not dist.enabled:
        return text
    message = str(exc)
    peer_lost = isinstance(exc, torch.distributed.DistError) or any(
        word in message for word in ("gloo", "NCCL", "timed out", "Timeout", "Connection")
    )
    if peer_lost:
        return (
            f"another rank of this {dist.world_size}-rank run died or stopped answering "
            f"(a collective failed after at most parallel.timeout_s): {text}"
        )
    return f"rank {dist.rank} of {dist.world_size}: {text}"


def run_from_cli(
    cfg: ExperimentConfig, run_dir: Path, resume: bool = False, lease: Lease | None = None
) -> int:
    summary = train(cfg, run_dir, resume=resume, lease=lease)
    if os.environ.get("RANK", "0") == "0":  # one summary on stdout, not one per rank
        print(json.dumps(summary, indent=2))
    return 0
