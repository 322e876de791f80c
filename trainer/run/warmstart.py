"""Supervised warm start: RL needs a policy that is sometimes right.

The base policy is trained with next-token cross-entropy on the task's target
responses until its greedy held-out accuracy lands in
[warm_start.target_accuracy_low, target_accuracy_high]. The result is cached
by a hash of everything that determines it (model, task, warm_start sections,
what the checkpoint and data files hold, not only their paths, the
vocabulary, and on the CPU the thread count and the CPU itself; ``warm_start.seed``, not
``run.seed``), so every run with the same base, every seed of a study
included, reuses it.

An unfinished warm start is kept too: ``KEY.partial.pt`` beside ``KEY.pt``
holds the model, the optimiser, the loop's RNG states and step, the last
check's snapshot and its step size, written atomically (temporary file, then
``os.replace``) at held-out checks at most every ``PARTIAL_EVERY_S`` seconds and
whenever the warm start is stopped (a cancel's or a worker shutdown's SIGTERM,
Ctrl-C, an expired lease). The next warm start of the same base, in this run's
next attempt or in any other run, continues from it, bit for bit the base an
uninterrupted warm start trains (same data order: the RNG states are restored),
and removes it once ``KEY.pt`` is written.
"""

from __future__ import annotations

import copy
import fcntl
import os
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from trainer.algorithms.balance import switch_aux_loss
from trainer.algorithms.losses import gather_logprobs
from trainer.config import ExperimentConfig
from trainer.devices.environment import cpu_key
from trainer.hf.loader import build_model
from trainer.model import TransformerLM
from trainer.rollout import RolloutEngine
from trainer.run.batches import collate_sft
from trainer.run.evaluation import greedy_accuracy
from trainer.run_folder.warmstart_progress import WarmStartReporter
from trainer.tasks import Task

CACHE_ENV = "MOE_LAB_CACHE"
# An unfinished warm start is saved at a held-out check when the last save is
# older than this (and always when it is stopped).
PARTIAL_EVERY_S = 60.0
PARTIAL_FORMAT = 1  # bumped when what the partial state holds changes: older ones are ignored


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


def warm_start_key(cfg: ExperimentConfig, vocab_size: int, device: torch.device) -> str:
    """The cache entry of a base: what determines its bits. On the CPU that
    includes the thread count: BLAS splits sums across threads, so the same
    config and seed on 1 and 2 threads train different bases (measured: held-out
    accuracy 0.27 vs 0.23 for the tiny MoE preset, parameters apart by up to 0.6);
    and the CPU (``trainer.devices.environment.cpu_key``: torch's capability and
    the processor's identity), whose kernels train another base from the same
    config, so a cache shared between machines never gives one CPU's base to another."""
    files = input_files_key(cfg)
    # A base that reads no file keeps the key it always had (bases cached before
    # file fingerprints existed stay valid).
    key = f"{cfg.hash('model', 'task', 'warm_start')}{'-' + files if files else ''}-v{vocab_size}"
    if device.type != "cpu":
        return key
    return f"{key}-cpu{torch.get_num_threads()}-{cpu_key()}"


def input_files_key(cfg: ExperimentConfig) -> str:
    """What the base's input files hold (``content_fingerprint``): the checkpoint
    folder and a text task's data files. The config names them by path only, and
    a file replaced at the same path must train a new base (or be refused)."""
    from trainer.hf.files import content_fingerprint

    paths = []
    if cfg.model.source != "builtin":
        paths.append(Path(cfg.model.source))
    if cfg.task.name == "text":
        from trainer.tasks.text_data import resolve_data_file

        paths.append(resolve_data_file(cfg.task.data_file, "task.data_file"))
        if cfg.task.eval_file:
            paths.append(resolve_data_file(cfg.task.eval_file, "task.eval_file"))
    return content_fingerprint(paths) if paths else ""


def _sft_loss(
    model: TransformerLM, problems, task: Task, device: torch.device, aux_loss_coef: float = 0.0
) -> torch.Tensor:
    """Next-token NLL of the targets, plus ``aux_loss_coef`` x the Switch balance
    loss averaged over the MoE layers (``warm_start.aux_loss_coef``): a base
    without dead experts has near-ties for a rollout engine to flip."""
    tokens, mask, loss_mask = collate_sft(problems, task.tokenizer, device)
    balance = aux_loss_coef > 0 and model.cfg.is_moe
    out = model(tokens, attention_mask=mask, return_routing=balance)
    logp = gather_logprobs(out.logits, tokens)
    loss = -(logp * loss_mask).sum() / loss_mask.sum().clamp(min=1)
    if balance:
        flat = mask.reshape(-1)
        aux = torch.stack(
            [
                switch_aux_loss(
                    r.probs.reshape(-1, r.probs.shape[-1]),
                    r.natural_indices.reshape(-1, r.natural_indices.shape[-1]),
                    model.cfg.n_experts,
                    mask=flat,
                )
                for r in out.routing
            ]
        ).mean()
        loss = loss + aux_loss_coef * aux
    return loss


def train_base_policy(
    cfg: ExperimentConfig,
    task: Task,
    vocab_size: int,
    device: torch.device,
    log=print,
    reporter: WarmStartReporter | None = None,
    interrupt: Callable[[], None] | None = None,
) -> WarmStartResult:
    """The SFT base policy, from the cache or trained here. ``reporter`` tells its
    progress (log lines with an ETA; RUN_DIR/progress.json when it has a run folder).
    ``interrupt`` is called before every SFT step and raises to stop (a cancel's
    SIGTERM, an expired lease): a long warm start must not delay either.

    With the cache on, one process at a time trains a given base: the others wait
    on the cache entry's lock and then load what it wrote, instead of training
    the same base side by side (``make up``'s worker slots start the demo's
    first runs at once)."""
    ws = cfg.warm_start
    reporter = reporter or WarmStartReporter(
        None, max_steps=ws.max_steps, target=ws.target_accuracy_low, log=log
    )
    key = warm_start_key(cfg, vocab_size, device)
    if not ws.cache:  # nothing kept on disk: a stopped warm start starts over
        state, acc, steps = _train(cfg, task, vocab_size, device, reporter, interrupt)
        return WarmStartResult(state, acc, steps, False, key)
    path = cache_dir() / f"{key}.pt"
    with _cache_entry_lock(path, log, interrupt):
        if path.exists():
            blob = torch.load(path, map_location="cpu", weights_only=False)
            reporter.cached(blob["accuracy"], blob["steps"])
            return WarmStartResult(blob["state_dict"], blob["accuracy"], blob["steps"], True, key)
        partial = PartialWarmStart(partial_path(key), key, device, reporter.log)
        state, acc, steps = _train(cfg, task, vocab_size, device, reporter, interrupt, partial)
        _write_cache(path, {"state_dict": state, "accuracy": acc, "steps": steps})
        partial.discard()
    return WarmStartResult(state, acc, steps, False, key)


def partial_path(key: str) -> Path:
    """Where an unfinished warm start of the base ``key`` is kept (module docstring)."""
    return cache_dir() / f"{key}.partial.pt"


def missed_target(cfg: ExperimentConfig, accuracy: float, steps: int) -> str | None:
    """What a base outside the target band means, in words for the run's log; None when
    the base landed in [target_accuracy_low, target_accuracy_high] (or the warm start
    is off)."""
    ws = cfg.warm_start
    if not ws.enabled:
        return None
    if accuracy < ws.target_accuracy_low:
        return (
            f"warm start missed its target: held-out accuracy {accuracy:.3f} after {steps} of "
            f"warm_start.max_steps={ws.max_steps} SFT steps, below target_accuracy_low="
            f"{ws.target_accuracy_low}; RL starts from a policy that is rarely right, so most "
            "groups have no reward signal (raise warm_start.max_steps or warm_start.lr)"
        )
    if accuracy > ws.target_accuracy_high:
        return (
            f"warm start overshot its target: held-out accuracy {accuracy:.3f} is above "
            f"target_accuracy_high={ws.target_accuracy_high}; RL has little left to learn"
        )
    return None


def _train(
    cfg: ExperimentConfig,
    task: Task,
    vocab_size: int,
    device: torch.device,
    reporter: WarmStartReporter,
    interrupt: Callable[[], None] | None,
    partial: PartialWarmStart | None = None,
) -> tuple[dict[str, torch.Tensor], float, int]:
    """SFT until the greedy held-out accuracy lands in the target band, continuing
    from ``partial``'s saved state when it has one and saving to it as it goes.
    Returns (CPU state dict, accuracy, SFT steps)."""
    ws = cfg.warm_start
    torch.manual_seed(ws.seed)
    model = build_model(cfg.model, vocab_size, device=device)
    model.set_moe_layer(cfg.run.moe_layer)
    engine = RolloutEngine(cfg.model, vocab_size, precision="fp32", device=device)
    eval_problems = task.eval_set()[: ws.eval_size]
    max_new = task.max_target_len

    def accuracy() -> float:
        engine.load_weights(model.state_dict())
        return greedy_accuracy(engine, task, eval_problems, max_new, device)

    rng = random.Random(ws.seed + 7919)
    optimizer = torch.optim.AdamW(model.parameters(), lr=ws.lr, betas=(0.9, 0.98))
    loop = partial.load(model, optimizer, rng) if partial is not None and ws.enabled else None
    if loop is not None:
        reporter.resumed(loop.step, loop.first_accuracy, loop.accuracy)
    else:
        acc = accuracy()
        reporter.begin(acc)
        loop = _Loop(0, ws.eval_every, acc, acc, None)
        if not ws.enabled or acc >= ws.target_accuracy_low:
            reporter.finish()
            return _cpu_state(model), acc, 0
        loop.snapshot = _copy_state(model, optimizer)
    while loop.step < ws.max_steps:
        if interrupt is not None:
            try:
                interrupt()
            except BaseException:  # stopped: keep what it has for the next warm start
                if partial is not None:
                    partial.save(model, optimizer, rng, loop, stopped=True)
                raise
        model.train()
        loss = _sft_loss(model, task.sample(ws.batch_size, rng), task, device, ws.aux_loss_coef)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        loop.step += 1
        if loop.step % loop.eval_every:
            continue
        loop.accuracy = acc = accuracy()
        reporter.check(loop.step, loss.item(), acc)
        if ws.target_accuracy_low <= acc <= ws.target_accuracy_high:
            break
        if acc > ws.target_accuracy_high and loop.eval_every > 1:
            # Overshot the band: go back to the last check and approach in smaller steps.
            model.load_state_dict(loop.snapshot[0])
            optimizer.load_state_dict(loop.snapshot[1])
            loop.eval_every = max(1, loop.eval_every // 4)
            for group in optimizer.param_groups:
                group["lr"] *= 0.5
            continue
        if acc > ws.target_accuracy_high:
            break
        loop.snapshot = _copy_state(model, optimizer)
        if partial is not None and partial.due():
            partial.save(model, optimizer, rng, loop)

    reporter.finish()
    return _cpu_state(model), loop.accuracy, loop.step


def _cpu_state(model: TransformerLM) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def _copy_state(model: TransformerLM, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    return copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())


@dataclass
class _Loop:
    """The SFT loop's own state, besides the model, optimiser and RNGs."""

    step: int
    eval_every: int  # shrinks after an overshoot
    accuracy: float  # the last held-out check's
    first_accuracy: float  # the untrained base's (the ETA's climb)
    snapshot: tuple[dict, dict] | None  # model and optimiser at the last check (the rollback)


class PartialWarmStart:
    """An unfinished warm start of one base, on disk (module docstring). Read and
    written under the cache entry's lock, so one process at a time touches it."""

    def __init__(
        self, path: Path, key: str, device: torch.device, log: Callable[[str], None]
    ) -> None:
        self.path, self.key, self.device, self.log = path, key, device, log
        self.saved_at = time.monotonic()

    def due(self) -> bool:
        return time.monotonic() - self.saved_at >= PARTIAL_EVERY_S

    def save(
        self, model, optimizer, rng: random.Random, loop: _Loop, *, stopped: bool = False
    ) -> None:
        blob = {
            "format": PARTIAL_FORMAT,
            "key": self.key,
            "loop": {k: v for k, v in loop.__dict__.items() if k != "snapshot"},
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "snapshot": loop.snapshot,
            "rng": {
                "python": rng.getstate(),
                "torch": torch.get_rng_state(),
                "cuda": self._cuda_rng(),
            },
        }
        try:
            _write_cache(self.path, blob)
        except OSError as exc:  # a full disk must not turn a stop into a crash
            self.log(f"warm start: could not save its state at step {loop.step} ({exc})")
            return
        self.saved_at = time.monotonic()
        if stopped:
            self.log(
                f"warm start stopped at step {loop.step}: its state is saved "
                f"({self.path}); the next warm start of this base resumes from it"
            )

    def load(self, model, optimizer, rng: random.Random) -> _Loop | None:
        """Restore the saved state into ``model``, ``optimizer``, ``rng`` and the
        torch RNGs; None (start over) when there is none or it does not fit."""
        if not self.path.exists():
            return None
        try:
            blob = torch.load(self.path, map_location="cpu", weights_only=False)
            _check_fits(blob, self.key, model, optimizer)
        except Exception as exc:  # unreadable or foreign: never worse than starting over
            self.log(f"warm start: ignoring the saved state {self.path} ({exc}); starting over")
            return None
        model.load_state_dict(blob["model"])
        optimizer.load_state_dict(blob["optimizer"])
        rng.setstate(blob["rng"]["python"])
        torch.set_rng_state(blob["rng"]["torch"])
        if blob["rng"]["cuda"] is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state(blob["rng"]["cuda"], self.device)
        return _Loop(**blob["loop"], snapshot=blob["snapshot"])

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)

    def _cuda_rng(self) -> torch.Tensor | None:
        return torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None


def _check_fits(blob: dict, key: str, model, optimizer) -> None:
    """ValueError unless ``blob`` is a partial state of this base that loads into
    ``model`` and ``optimizer`` (checked before either is touched)."""
    if blob.get("format") != PARTIAL_FORMAT or blob.get("key") != key:
        raise ValueError("saved by another version or for another base")
    own = model.state_dict()
    saved = blob["model"]
    if set(saved) != set(own) or any(saved[k].shape != own[k].shape for k in own):
        raise ValueError("its parameters do not match the model")
    groups = blob["optimizer"]["param_groups"]
    if [len(g["params"]) for g in groups] != [len(g["params"]) for g in optimizer.param_groups]:
        raise ValueError("its optimiser does not match the model")


# How often a process waiting for another's warm start of the same base looks
# again (and checks its own cancel/lease): short next to a warm start's minutes.
LOCK_POLL_S = 0.5


@contextmanager
def _cache_entry_lock(
    path: Path, log: Callable[[str], None], interrupt: Callable[[], None] | None
) -> Iterator[None]:
    """Hold the cache entry's ``flock`` (``KEY.lock`` beside ``KEY.pt``). Waiting
    polls a non-blocking lock so a cancel or an expired lease still ends the wait."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        said = False
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not said:
                    log("warm start: another run is training this base policy; waiting to reuse it")
                    said = True
                if interrupt is not None:
                    interrupt()
                time.sleep(LOCK_POLL_S)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _write_cache(path: Path, blob: dict) -> None:
    """Atomic write (temporary file + rename), called under the entry's lock."""
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    torch.save(blob, tmp)
    os.replace(tmp, path)
