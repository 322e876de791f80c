"""Which problems are held out for evaluation.

A problem is held out when a salted hash of its key (its prompt, which names
the problem uniquely) falls below a threshold. ``Task.sample`` rejects every
held-out key and ``Task.eval_set`` draws only held-out keys, so training draws
and the evaluation set are disjoint by construction, and the split is a pure
function of (key, eval_seed): no state to save or restore.

* Large problem spaces: the threshold is ``HELD_OUT_SHARE`` itself, so about
  that share of the space is held out.
* Small problem spaces (at most ``ENUMERATE_LIMIT`` keys, e.g. 1-digit
  addition with its 100 problems): the keys are enumerated and exactly
  ``ceil(HELD_OUT_SHARE * N)`` of them (the smallest hashes) are held out, so
  a tiny space never ends up with an empty or oversized evaluation set. The
  evaluation set is capped at that count.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable

HELD_OUT_SHARE = 0.1
ENUMERATE_LIMIT = 50_000


def hash_unit(key: str, salt: int) -> float:
    """A stable pseudo-random number in [0, 1) for ``key`` (blake2b, salted by ``salt``)."""
    digest = hashlib.blake2b(f"{salt}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


class HeldOutSplit:
    """Decides membership of the held-out set; see the module docstring."""

    def __init__(self, salt: int, all_keys: Iterable[str] | None = None) -> None:
        """``all_keys``: every key of the space when it is small enough to list, else None."""
        self.salt = salt
        if all_keys is None:
            self.threshold = HELD_OUT_SHARE
            self.count: int | None = None  # unknown: about HELD_OUT_SHARE of a large space
        else:
            units = sorted(hash_unit(key, salt) for key in all_keys)
            if not units:
                raise ValueError("the problem space is empty")
            self.count = max(1, math.ceil(HELD_OUT_SHARE * len(units)))
            if self.count >= len(units):
                raise ValueError("the problem space is too small to hold problems out")
            # Held out iff unit < threshold: exactly the `count` smallest hashes.
            self.threshold = units[self.count]

    def is_held_out(self, key: str) -> bool:
        return hash_unit(key, self.salt) < self.threshold
