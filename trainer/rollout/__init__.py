"""Rollout engine: separate inference implementation with its own precision.

See docs/trainer-internals.md ("Rollout engine") for the interface.
"""

from trainer.rollout.engine import RolloutBatch, RolloutEngine, prompt_logprobs
from trainer.rollout.numerics import Numerics
from trainer.rollout.routing_pack import PackedRouting, index_dtype
from trainer.rollout.sampling import sample_next, scaled_logprobs, top_p_filter

__all__ = [
    "Numerics",
    "PackedRouting",
    "RolloutBatch",
    "RolloutEngine",
    "index_dtype",
    "prompt_logprobs",
    "sample_next",
    "scaled_logprobs",
    "top_p_filter",
]
