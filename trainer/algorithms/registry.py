"""The one table of policy-gradient algorithms: what differs between PPO, GRPO and GSPO.

Everything that depends on ``algorithm.name`` reads it from here (the config's
clip defaults, the value head, the advantage estimator, the policy loss), so
adding an algorithm is one row, not a search for ``name == ...`` branches.
Plain data: the schema (``trainer.config``) imports it without torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Algorithm:
    """One policy-gradient algorithm.

    advantage: ``group`` = reward minus its prompt group's mean, divided by the
        group std (GRPO, arXiv 2402.03300), one value per sequence ``(B,)``;
        ``gae`` = generalised advantage estimation on a learned value head
        (PPO, Schulman et al. 2017, arXiv 1707.06347), per token ``(B, T)``.
    ratio: ``token`` = clipped ratio of each token's probability (PPO/GRPO);
        ``sequence`` = one length-normalised ratio per sequence (GSPO,
        arXiv 2507.18071), whose natural clip range is ~1000x narrower.
    clip_eps_low, clip_eps_high: the clip range used when the config leaves it empty.
    """

    name: str
    advantage: Literal["group", "gae"]
    ratio: Literal["token", "sequence"]
    clip_eps_low: float
    clip_eps_high: float

    @property
    def has_value_head(self) -> bool:
        """GAE needs a value estimate; the group baseline replaces it (no critic)."""
        return self.advantage == "gae"


ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in (
        Algorithm("ppo", advantage="gae", ratio="token", clip_eps_low=0.2, clip_eps_high=0.2),
        Algorithm("grpo", advantage="group", ratio="token", clip_eps_low=0.2, clip_eps_high=0.2),
        Algorithm(
            "gspo", advantage="group", ratio="sequence", clip_eps_low=3e-4, clip_eps_high=4e-4
        ),
    )
}


def algorithm(name: str) -> Algorithm:
    return ALGORITHMS[name]
