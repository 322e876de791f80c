"""Shared fixtures for the trainer tests: tiny configs, few threads."""

from __future__ import annotations

import pytest
import torch

from trainer.config import ModelConfig


@pytest.fixture(autouse=True)
def _few_threads():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory):
    """(run folder, summary) of one tiny finished run (moe-grpo, test_runner.FAST: 4
    steps, checkpoints at 2 and 4), trained once per test process for every test
    that only reads a finished run. Read it, never write to it."""
    from test_runner import fast_config

    from trainer.run.runner import train

    with pytest.MonkeyPatch.context() as patch:
        # the warm-start cache test_runner's tests share
        patch.setenv("MOE_LAB_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
        run_dir = tmp_path_factory.mktemp("finished-run")
        summary = train(fast_config(), run_dir)
    return run_dir, summary


@pytest.fixture
def tiny_moe_cfg() -> ModelConfig:
    return ModelConfig(n_layers=2, d_model=32, n_heads=4, n_experts=8, top_k=2, expert_hidden=16)


@pytest.fixture
def tiny_dense_cfg() -> ModelConfig:
    return ModelConfig(n_layers=2, d_model=32, n_heads=4, n_experts=0, top_k=2, expert_hidden=16)


@pytest.fixture
def make_batch():
    return left_padded_batch


def left_padded_batch(vocab: int, lengths: list[int], width: int, seed: int = 0):
    """Random tokens (B, width) with the given real lengths, left-padded with 0."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(3, vocab, (len(lengths), width), generator=gen)
    mask = torch.zeros(len(lengths), width, dtype=torch.bool)
    for row, length in enumerate(lengths):
        mask[row, width - length :] = True
    return tokens.masked_fill(~mask, 0), mask
