"""One process at a time trains a given base policy: a second one waits on the
cache entry's lock (still cancellable) and then reuses what the first wrote,
instead of training the same base side by side."""

from __future__ import annotations

import fcntl

import pytest
import torch

from trainer.config import apply_overrides
from trainer.config.presets import preset_dict
from trainer.devices.environment import cpu_key
from trainer.run.warmstart import cache_dir, train_base_policy, warm_start_key
from trainer.tasks.factory import make_task
from trainer.validation import validate_config


class Cancelled(Exception):
    pass


@pytest.fixture
def setup(tmp_path, monkeypatch):
    monkeypatch.setenv("MOE_LAB_CACHE", str(tmp_path / "cache"))
    cfg = validate_config(apply_overrides(preset_dict("moe-grpo"), ["warm_start.max_steps=1"]))
    task = make_task(cfg.task)
    vocab = task.tokenizer.vocab_size
    path = cache_dir() / f"{warm_start_key(cfg, vocab, torch.device('cpu'))}.pt"
    path.parent.mkdir(parents=True)
    return cfg, task, vocab, path


def test_a_second_process_waits_and_its_cancel_still_works(setup):
    cfg, task, vocab, path = setup
    logged: list[str] = []
    polls = []

    def interrupt():
        polls.append(1)
        if len(polls) >= 3:
            raise Cancelled

    with open(path.with_suffix(".lock"), "w") as held:  # another worker is training it
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(Cancelled):
            train_base_policy(cfg, task, vocab, torch.device("cpu"), log=logged.append,
                              interrupt=interrupt)  # fmt: skip
    assert len(polls) == 3
    assert any("another run is training this base policy" in line for line in logged)


def test_after_the_wait_the_other_process_base_is_reused(setup):
    cfg, task, vocab, path = setup
    written = {"state_dict": {"w": torch.ones(2)}, "accuracy": 0.3, "steps": 7}

    def other_worker_finishes():
        # What the first process does before it lets go of the lock.
        torch.save(written, path)
        fcntl.flock(held, fcntl.LOCK_UN)

    with open(path.with_suffix(".lock"), "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        result = train_base_policy(
            cfg, task, vocab, torch.device("cpu"), log=lambda _: None,
            interrupt=other_worker_finishes,
        )  # fmt: skip
    assert (
        result.cached and result.steps == 7 and torch.equal(result.state_dict["w"], torch.ones(2))
    )


def test_the_cpu_thread_count_is_part_of_the_base_key():
    """BLAS splits sums across threads, so a CPU base trained on 1 and on 2 threads
    differs; the cache must never hand one to a run that would train the other."""
    cfg = validate_config(preset_dict("moe-grpo"))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = warm_start_key(cfg, 32, torch.device("cpu"))
        torch.set_num_threads(2)
        two = warm_start_key(cfg, 32, torch.device("cpu"))
        gpu = warm_start_key(cfg, 32, torch.device("cuda"))
    finally:
        torch.set_num_threads(before)
    suffix = f"-{cpu_key()}"
    assert one.endswith(f"-cpu1{suffix}") and two.endswith(f"-cpu2{suffix}")
    assert one.removesuffix(f"-cpu1{suffix}") == two.removesuffix(f"-cpu2{suffix}")
    assert gpu == one.removesuffix(f"-cpu1{suffix}")  # a GPU's base does not depend on the CPU


def test_the_cpu_is_part_of_the_base_key(monkeypatch):
    """Another CPU trains another base from the same config (other kernels): a cache
    shared between machines must keep their bases apart, by capability and by model."""
    from trainer.devices import environment

    cfg = validate_config(preset_dict("moe-grpo"))
    cpu = torch.device("cpu")
    here = warm_start_key(cfg, 32, cpu)
    record = dict(environment.cpu_record())
    monkeypatch.setattr(environment, "cpu_record", lambda: {**record, "capability": "AVX2"})
    other_isa = warm_start_key(cfg, 32, cpu)
    monkeypatch.setattr(environment, "cpu_record", lambda: {**record, "model_name": "Other CPU"})
    other_model = warm_start_key(cfg, 32, cpu)
    assert len({here, other_isa, other_model}) == 3
    assert "-AVX2-" in other_isa
