"""Supervised warm start: RL needs a policy that is sometimes right.

The base policy is trained with next-token cross-entropy on the task's target
responses until its greedy held-out accuracy lands in
[warm_start.target_accuracy_low, target_accuracy_high]. The result is cached
by a hash of everything that determines it (model, task, warm_start sections,
vocabulary; ``warm_start.seed``, not ``run.seed``), so every run with the same
base, every seed of a study included, reuses it.
"""

from __future__ import annotations

import copy
import fcntl
import os
import random
from dataclasses import dataclass
from pathlib import Path

import torch

from trainer.algorithms.losses import gather_logprobs
from trainer.config import ExperimentConfig
from trainer.data import collate_sft
from trainer.evaluation import greedy_accuracy
from trainer.model import TransformerLM
from trainer.rollout import RolloutEngine
from trainer.tasks import Task

CACHE_ENV = "MOE_LAB_CACHE"


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "moe-rl-lab"
    return Path(os.environ.get(CACHE_ENV, default)) / "warmstart"


@dataclass
class WarmStartResult:
    state_dict: dict[str, torch.Tensor]
    accuracy: float
    steps: int
    cached: bool
    key: str


def warm_start_key(cfg: ExperimentConfig, vocab_size: int) -> str:
    return f"{cfg.hash('model', 'task', 'warm_start')}-v{vocab_size}"


def _sft_loss(model: TransformerLM, problems, task: Task, device: torch.device) -> torch.Tensor:
    tokens, mask, loss_mask = collate_sft(problems, task.tokenizer, device)
    logits = model(tokens, attention_mask=mask).logits
    logp = gather_logprobs(logits, tokens)
    return -(logp * loss_mask).sum() / loss_mask.sum().clamp(min=1)


def train_base_policy(
    cfg: ExperimentConfig, task: Task, vocab_size: int, device: torch.device, log=print
) -> WarmStartResult:
    ws = cfg.warm_start
    key = warm_start_key(cfg, vocab_size)
    path = cache_dir() / f"{key}.pt"
    if ws.cache and path.exists():
        blob = torch.load(path, map_location="cpu", weights_only=False)
        return WarmStartResult(blob["state_dict"], blob["accuracy"], blob["steps"], True, key)

    torch.manual_seed(ws.seed)
    model = TransformerLM(cfg.model, vocab_size).to(device)
    engine = RolloutEngine(cfg.model, vocab_size, precision="fp32", device=device)
    eval_problems = task.eval_set()[: ws.eval_size]
    max_new = task.max_target_len

    def accuracy() -> float:
        engine.load_weights(model.state_dict())
        return greedy_accuracy(engine, task, eval_problems, max_new, device)

    acc = accuracy()
    steps = 0
    if ws.enabled and acc < ws.target_accuracy_low:
        rng = random.Random(ws.seed + 7919)
        lr, eval_every = ws.lr, ws.eval_every
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98))
        snapshot = (copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict()))
        while steps < ws.max_steps:
            model.train()
            loss = _sft_loss(model, task.sample(ws.batch_size, rng), task, device)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            steps += 1
            if steps % eval_every:
                continue
            acc = accuracy()
            log(f"warm start step {steps}: loss {loss.item():.3f}  held-out accuracy {acc:.3f}")
            if ws.target_accuracy_low <= acc <= ws.target_accuracy_high:
                break
            if acc > ws.target_accuracy_high and eval_every > 1:
                # Overshot the band: go back to the last check and approach in smaller steps.
                model.load_state_dict(snapshot[0])
                optimizer.load_state_dict(snapshot[1])
                eval_every = max(1, eval_every // 4)
                for group in optimizer.param_groups:
                    group["lr"] *= 0.5
                continue
            if acc > ws.target_accuracy_high:
                break
            snapshot = (copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict()))

    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    if ws.cache:
        _write_cache(path, {"state_dict": state, "accuracy": acc, "steps": steps})
    return WarmStartResult(state, acc, steps, False, key)


def _write_cache(path: Path, blob: dict) -> None:
    """Atomic write under a file lock: concurrent workers may train the same base."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        torch.save(blob, tmp)
        os.replace(tmp, path)
