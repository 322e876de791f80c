"""Batched next-token sampling: temperature, nucleus (top-p), seeded generator."""

from __future__ import annotations

import torch


def scaled_logprobs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """fp32 log-softmax of logits / temperature (greedy, temperature 0, uses 1).

    These are the log-probs of the distribution actually sampled from, so the
    training side must score tokens with the same temperature.
    """
    logits = logits.float()
    if temperature > 0 and temperature != 1.0:  # x / 1.0 == x: skip the op
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1)


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero the tail outside the smallest set of tokens with mass >= top_p
    (Holtzman et al. 2019); the most likely token is always kept. (B, V)."""
    if top_p >= 1.0:
        return probs
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
    return torch.zeros_like(probs).scatter_(-1, order, sorted_probs)


def sample_next(
    logprobs: torch.Tensor,
    temperature: float,
    top_p: float,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """logprobs: (B, V) from ``scaled_logprobs``. Returns (B,) token ids.

    Sampling is the exponential race: argmax_i p_i / q_i with q_i ~ Exp(1)
    picks i with probability p_i (equivalently, the Gumbel-max trick). It is
    the algorithm ``torch.multinomial`` runs for one sample, written out so
    the decode loop skips multinomial's input checks (two host syncs per
    step); with the same generator it draws the same tokens.
    """
    if temperature <= 0:
        return logprobs.argmax(dim=-1)
    probs = top_p_filter(logprobs.exp(), top_p)
    race = torch.empty_like(probs).exponential_(1, generator=generator)
    return (probs / race).argmax(dim=-1)


def sampling_stream(generator: torch.Generator | None, device: torch.device) -> torch.Generator:
    """The generator ``sample_next`` draws from: ``generator``, or the device's default
    one (what ``exponential_(generator=None)`` uses), so that its state can be saved."""
    if generator is not None:
        return generator
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return torch.cuda.default_generators[index]
    return torch.default_generator


def replay_draws(
    generator: torch.Generator, state: torch.Tensor, draws: int, like: torch.Tensor
) -> None:
    """Set ``generator`` to where ``draws`` calls of ``sample_next`` on logprobs shaped
    like ``like`` (B, V) take it from ``state``: each call draws one (B, V)
    exponential, so the same draws give the same state on any device. A decode
    loop that sampled past its stop uses it to leave the stream exactly where a
    loop that stopped in time would."""
    generator.set_state(state)
    scratch = torch.empty_like(like, dtype=torch.float32)
    for _ in range(draws):
        scratch.exponential_(1, generator=generator)
