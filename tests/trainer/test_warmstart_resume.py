"""An interrupted warm start resumes instead of starting again: its state (model,
optimiser, RNGs, step, the last check's snapshot) is saved atomically in the
warm-start cache when it is stopped and at held-out checks, and the next warm
start of the same base continues from it, to the very base an uninterrupted
warm start trains (bit for bit on the CPU: same data order, same sums)."""

from __future__ import annotations

import pytest
import torch

from trainer.config import apply_overrides
from trainer.config.presets import preset_dict
from trainer.run import warmstart
from trainer.run.warmstart import cache_dir, partial_path, train_base_policy, warm_start_key
from trainer.tasks.factory import make_task
from trainer.validation import validate_config

# A few seconds on one thread: 8 SFT steps, a held-out check every 3, a target out
# of reach so every warm start runs all 8 steps.
OVERRIDES = [
    "warm_start.max_steps=8",
    "warm_start.eval_every=3",
    "warm_start.eval_size=8",
    "warm_start.batch_size=8",
    "warm_start.target_accuracy_low=0.99",
    "warm_start.target_accuracy_high=1.0",
]
CPU = torch.device("cpu")


class Stop(Exception):
    """What the runner's interrupt raises on SIGTERM/SIGINT (StopRequested)."""


@pytest.fixture(scope="module")
def cfg():
    return validate_config(apply_overrides(preset_dict("moe-grpo"), OVERRIDES))


def _warm_start(cfg, interrupt=None, log=None):
    """One warm start as a fresh trainer process runs it (its own task)."""
    task = make_task(cfg.task)
    vocab = task.tokenizer.vocab_size
    return train_base_policy(cfg, task, vocab, CPU, log=log or (lambda _: None),
                             interrupt=interrupt)  # fmt: skip


def _key(cfg) -> str:
    return warm_start_key(cfg, make_task(cfg.task).tokenizer.vocab_size, CPU)


@pytest.fixture(scope="module")
def uninterrupted(cfg, tmp_path_factory):
    """The base an uninterrupted warm start trains (on one thread, as every test
    here runs: conftest's ``_few_threads`` is set up after a module fixture)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("MOE_LAB_CACHE", str(tmp_path_factory.mktemp("whole")))
            return _warm_start(cfg)
    finally:
        torch.set_num_threads(threads)


def _same_base(a, b) -> bool:
    return (
        a.steps == b.steps
        and a.accuracy == b.accuracy
        and all(torch.equal(a.state_dict[k], b.state_dict[k]) for k in a.state_dict)
    )


def test_a_stopped_warm_start_resumes_from_its_step_to_the_uninterrupted_base(
    cfg, uninterrupted, tmp_path, monkeypatch
):
    monkeypatch.setenv("MOE_LAB_CACHE", str(tmp_path))
    calls = []

    def stop_after_five_steps():
        calls.append(1)
        if len(calls) == 6:  # checked before every SFT step: 5 done, between two checks
            raise Stop

    lines: list[str] = []
    with pytest.raises(Stop):
        _warm_start(cfg, stop_after_five_steps, lines.append)
    saved = torch.load(partial_path(_key(cfg)), weights_only=False)
    assert saved["loop"]["step"] == 5 and saved["key"] == _key(cfg)
    assert any("warm start stopped at step 5" in line for line in lines)
    assert not list(cache_dir().glob("*.tmp"))  # written to a temporary, then renamed

    steps_run = []
    lines.clear()
    resumed = _warm_start(cfg, lambda: steps_run.append(1), lines.append)
    assert len(steps_run) == 3  # steps 6, 7 and 8 only: it continued from step 5
    assert any("resuming at step 5/8" in line for line in lines)
    assert _same_base(resumed, uninterrupted)  # same weights, bit for bit
    assert not resumed.cached
    # Finished: the base is cached as before, the partial state is gone.
    assert not partial_path(_key(cfg)).exists()
    assert (cache_dir() / f"{_key(cfg)}.pt").exists()


def test_a_killed_warm_start_resumes_from_its_last_saved_check(
    cfg, uninterrupted, tmp_path, monkeypatch
):
    """No stop to react to (SIGKILL, a crash): the state saved at the last
    held-out check is what the next warm start continues from."""
    monkeypatch.setenv("MOE_LAB_CACHE", str(tmp_path))
    monkeypatch.setattr(warmstart, "PARTIAL_EVERY_S", 0.0)  # save at every check
    real_loss, losses = warmstart._sft_loss, []

    def dies_in_step_seven(*args, **kwargs):
        losses.append(1)
        if len(losses) == 7:
            raise RuntimeError("killed")
        return real_loss(*args, **kwargs)

    with monkeypatch.context() as mp:
        mp.setattr(warmstart, "_sft_loss", dies_in_step_seven)
        with pytest.raises(RuntimeError, match="killed"):
            _warm_start(cfg)
    assert torch.load(partial_path(_key(cfg)), weights_only=False)["loop"]["step"] == 6
    steps_run = []
    assert _same_base(_warm_start(cfg, lambda: steps_run.append(1)), uninterrupted)
    assert len(steps_run) == 2


def test_a_foreign_partial_state_is_ignored(cfg, uninterrupted, tmp_path, monkeypatch):
    monkeypatch.setenv("MOE_LAB_CACHE", str(tmp_path))
    path = partial_path(_key(cfg))
    path.parent.mkdir(parents=True)
    torch.save({"format": 0, "key": "another base"}, path)
    lines: list[str] = []
    assert _same_base(_warm_start(cfg, log=lines.append), uninterrupted)
    assert any("ignoring the saved state" in line for line in lines)
