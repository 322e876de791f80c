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

SIGTERM finishes the current step, checkpoints and ends with status cancelled.
"""

from __future__ import annotations

import contextlib
import copy
import json
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trainer import metric_keys as K
from trainer.checkpoint import load_checkpoint, restore_rng, rng_state, save_checkpoint
from trainer.collapse import CollapseDetector
from trainer.config import ExperimentConfig
from trainer.data import collate_prompts, decode_responses, repeat_for_groups
from trainer.evaluation import greedy_accuracy
from trainer.model import TransformerLM
from trainer.progress import Progress
from trainer.rollout import RolloutEngine
from trainer.run_files import CONFIG_FILE, SUMMARY_FILE, MetricsWriter, write_json_atomic
from trainer.schedules import entropy_coef_at, lr_at, prompts_at
from trainer.tasks import make_task
from trainer.update import PolicyUpdater, RolloutData, measure_batch
from trainer.warmstart import train_base_policy


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("run.device is 'cuda' but no CUDA device is available")
    return torch.device(name)


class _StopFlag:
    """Set by SIGTERM/SIGINT; the loop checks it between steps."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            # signal() raises ValueError outside the main thread (e.g. a test runner thread).
            with contextlib.suppress(ValueError):
                self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame) -> None:
        self.requested = True


@dataclass
class RunState:
    step: int = 0
    accuracy_history: list[float] = field(default_factory=list)
    eval_history: list[tuple[int, float]] = field(default_factory=list)
    initial_accuracy: float | None = None
    wall_time_s: float = 0.0


def train(
    cfg: ExperimentConfig,
    run_dir: Path,
    *,
    resume: bool = False,
    stop_after: int | None = None,
    log=None,
) -> dict[str, Any]:
    """Train one run into ``run_dir``; returns the summary (also in summary.json).

    ``stop_after`` ends this invocation after that many steps with a checkpoint
    (status "stopped"), so a later ``resume`` continues the same run.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    progress = Progress(cfg.run.steps)
    log = log or progress.message
    stop = _StopFlag()
    stop.install()
    try:
        return _train(cfg, run_dir, resume, stop_after, stop, progress, log, t_start)
    finally:
        stop.uninstall()


def _train(cfg, run_dir, resume, stop_after, stop, progress, log, t_start) -> dict[str, Any]:
    device = resolve_device(cfg.run.device)
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    (run_dir / CONFIG_FILE).write_text(json.dumps(cfg.to_dict(), indent=2, sort_keys=True))

    # ---- task, base policy, reference, rollout engine -----------------------------------
    task = make_task(cfg.task)
    vocab_size = cfg.model.vocab_size or task.tokenizer.vocab_size
    base = train_base_policy(cfg, task, vocab_size, device, log=log)
    log(
        f"base policy: held-out accuracy {base.accuracy:.3f} after {base.steps} SFT steps"
        + (" (cached)" if base.cached else "")
    )
    torch.manual_seed(cfg.run.seed)
    is_ppo = cfg.algorithm.name == "ppo"
    policy = TransformerLM(cfg.model, vocab_size, value_head=is_ppo).to(device)
    policy.load_state_dict(base.state_dict, strict=not is_ppo)
    reference = None
    if cfg.algorithm.kl_coef > 0:
        reference = copy.deepcopy(policy).eval().requires_grad_(False)
    engine = RolloutEngine(cfg.model, vocab_size, precision=cfg.rollout.precision, device=device)
    eval_problems = task.eval_set()

    # ---- state that a checkpoint carries -----------------------------------------------
    py_rng = random.Random(cfg.run.seed)
    generators = {
        "sample": torch.Generator(device=device).manual_seed(cfg.run.seed),
        "shuffle": torch.Generator().manual_seed(cfg.run.seed + 1),
    }
    # Builds the run's Stabilizers too (after the reference copy: noisy gating adds
    # noise-scale parameters to the policy's routers, never to the frozen reference).
    updater = PolicyUpdater(cfg, policy, reference, generators["shuffle"])
    collapse = CollapseDetector(cfg.run.collapse)
    state = RunState(initial_accuracy=base.accuracy)

    resume_step = None
    ckpt = None
    if resume:
        ckpt = load_checkpoint(run_dir)
    if resume and ckpt is not None:
        policy.load_state_dict(ckpt["policy"])
        if reference is not None and ckpt.get("reference") is not None:
            reference.load_state_dict(ckpt["reference"])
        updater.load_state_dict(ckpt["updater"])
        collapse.load_state_dict(ckpt["collapse"])
        restore_rng(ckpt["rng"], py_rng, generators)
        state = RunState(**ckpt["run_state"])
        resume_step = state.step - 1
        log(f"resumed from the checkpoint at step {state.step}")
    else:
        # Held-out accuracy of the starting policy, measured the way every later
        # evaluation is (the rollout engine, greedy), so final - initial is fair.
        engine.load_weights(policy.state_dict())
        state.initial_accuracy = greedy_accuracy(
            engine, task, eval_problems, cfg.rollout.max_new_tokens, device
        )
    metrics_out = MetricsWriter(run_dir, resume_from_step=resume_step if resume else None)
    progress.start = state.step

    def checkpoint() -> None:
        save_checkpoint(
            run_dir,
            {
                "policy": policy.state_dict(),
                "reference": reference.state_dict() if reference is not None else None,
                "updater": updater.state_dict(),
                "collapse": collapse.state_dict(),
                "rng": rng_state(py_rng, generators),
                "run_state": state.__dict__,
                "config": cfg.to_dict(),
            },
        )

    status = "succeeded"
    steps_this_call = 0
    t_segment = time.perf_counter()
    wall_before = state.wall_time_s
    try:
        while state.step < cfg.run.steps:
            step = state.step
            metrics = _rl_step(cfg, step, task, policy, engine, updater, py_rng, generators, device)

            finite = bool(metrics.pop("_finite"))
            acc = metrics[K.REWARD_ACCURACY]
            state.accuracy_history.append(acc)
            if step % cfg.run.eval_every == 0 or step == cfg.run.steps - 1:
                engine.load_weights(policy.state_dict())
                eval_acc = greedy_accuracy(
                    engine, task, eval_problems, cfg.rollout.max_new_tokens, device
                )
                metrics[K.EVAL_ACCURACY] = eval_acc
                state.eval_history.append((step, eval_acc))
            if collapse.update(step, acc, finite=finite):
                log(f"collapse at step {collapse.collapse_step}: {collapse.collapse_reason}")

            metrics_out.write(step, metrics)
            state.step = step + 1
            steps_this_call += 1
            state.wall_time_s = wall_before + time.perf_counter() - t_segment
            progress.update(step, {"acc": acc, "kl_k3": metrics.get(K.MISMATCH_KL_K3, 0.0)})

            if collapse.collapsed and cfg.run.stop_on_collapse:
                break
            if stop.requested:
                status = "cancelled"
                break
            if stop_after is not None and steps_this_call >= stop_after:
                status = "stopped"
                break
            if state.step % cfg.run.checkpoint_every == 0:
                checkpoint()
        checkpoint()
    except Exception as exc:
        status = "failed"
        summary = _summary(cfg, state, collapse, status, time.perf_counter() - t_start)
        summary["error"] = f"{type(exc).__name__}: {exc}"
        write_json_atomic(run_dir / SUMMARY_FILE, summary)
        raise
    finally:
        metrics_out.close()

    summary = _summary(cfg, state, collapse, status, state.wall_time_s)
    write_json_atomic(run_dir / SUMMARY_FILE, summary)
    return summary


def _rl_step(cfg, step, task, policy, engine, updater, py_rng, generators, device):
    """One RL step; returns the step's metrics (plus ``_finite``)."""
    t0 = time.perf_counter()
    tok = task.tokenizer

    # 1. rollout: the engine gets this step's weights, as vLLM gets a weight sync.
    n_prompts = prompts_at(step, cfg.rollout, cfg.optim)
    problems = repeat_for_groups(task.sample(n_prompts, py_rng), cfg.rollout.group_size)
    prompts, prompt_mask = collate_prompts(problems, tok, device)
    engine.load_weights(policy.state_dict())
    rollout = engine.generate(
        prompts,
        prompt_mask,
        max_new_tokens=cfg.rollout.max_new_tokens,
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        eos_id=tok.eos_id,
        pad_id=tok.pad_id,
        generator=generators["sample"],
        use_kv_cache=cfg.rollout.kv_cache,
    )
    t_rollout = time.perf_counter()

    # 2. score: verifiable rewards.
    texts = decode_responses(rollout.tokens, rollout.response_mask, tok)
    rewards = torch.tensor([task.reward(p, t) for p, t in zip(problems, texts, strict=True)])
    correct = torch.tensor(
        [float(task.is_correct(p, t)) for p, t in zip(problems, texts, strict=True)]
    )
    # The engine's routing travels bit-packed (stabilizers.replay_compression).
    data = RolloutData.from_rollout(rollout, rewards.to(device), cfg.stabilizers.replay_compression)

    # 3. measure: one training forward on the rollout tokens, before any update
    #    (R3 replays the engine's routing there; the step's replay mask comes first).
    stabilizers = updater.stabilizers
    metrics = stabilizers.begin_step(step, data)
    metrics.update(measure_batch(cfg, policy, updater, data))
    t_measure = time.perf_counter()

    # 4-5. advantages and the off-policy update, then the routing controllers
    #      (aux-free bias, router-anchor buffer, temperature) act on the step's loads.
    lr = lr_at(step, cfg.run.steps, cfg.optim)
    entropy_coef = entropy_coef_at(step, cfg.run.steps, cfg.optim)
    metrics.update(updater.update(data, step, lr=lr, entropy_coef=entropy_coef))
    stabilizers.end_step(step)
    t_train = time.perf_counter()

    n_response_tokens = int(rollout.response_mask.sum())
    metrics.update(
        {
            K.REWARD_MEAN: rewards.mean().item(),
            K.REWARD_ACCURACY: correct.mean().item(),
            K.RESPONSE_LENGTH_MEAN: rollout.response_mask.sum(1).float().mean().item(),
            K.OPTIM_LR: lr,
            K.OPTIM_BATCH_SIZE: float(len(problems)),
            K.OPTIM_ENTROPY_COEF: entropy_coef,
            K.TIME_ROLLOUT_S: t_rollout - t0,
            K.TIME_MISMATCH_S: t_measure - t_rollout,
            K.TIME_TRAIN_S: t_train - t_measure,
            K.TIME_STEP_S: t_train - t0,
            K.THROUGHPUT_TOKENS_PER_S: n_response_tokens / max(t_rollout - t0, 1e-9),
        }
    )
    return metrics


def _summary(cfg, state: RunState, collapse: CollapseDetector, status: str, wall: float):
    evals = [acc for _, acc in state.eval_history]
    return {
        "status": status,
        "collapsed": collapse.collapsed,
        "collapse_step": collapse.collapse_step,
        "collapse_reason": collapse.collapse_reason,
        "initial_accuracy": state.initial_accuracy,
        "final_accuracy": evals[-1] if evals else None,
        "best_accuracy": max(evals) if evals else None,
        "final_batch_accuracy": state.accuracy_history[-1] if state.accuracy_history else None,
        "steps": state.step,
        "total_steps": cfg.run.steps,
        "wall_time_s": round(wall, 3),
    }


def run_from_cli(cfg: ExperimentConfig, run_dir: Path, resume: bool = False) -> int:
    summary = train(cfg, run_dir, resume=resume)
    print(json.dumps(summary, indent=2))
    return 0
