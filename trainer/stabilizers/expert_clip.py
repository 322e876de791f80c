"""Per-expert gradient clipping (config ``optim.per_expert_grad_clip``).

Stacked expert weights hold the expert on dim 0 (``(E, d_in, d_out)``); each
expert's gradient is clipped to ``max_norm`` on its own, so one expert with a
huge gradient (e.g. the one that suddenly receives most tokens) does not shrink
the update of every other expert, as a global clip would. The scale follows
``torch.nn.utils.clip_grad_norm_``: ``min(1, max_norm / (norm + 1e-6))``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor

_EPS = 1e-6


def _clip_scale(norms: Tensor, max_norm: float) -> Tensor:
    return (max_norm / (norms + _EPS)).clamp(max=1.0)


def clip_expert_params_(
    named_params: Iterable[tuple[str, torch.nn.Parameter]],
    max_norm: float,
    is_expert_param: Callable[[str], bool],
) -> dict[str, Tensor]:
    """Per-expert clipping of every stacked expert parameter's ``.grad``, in place.

    ``named_params``: e.g. ``model.named_parameters()``; ``is_expert_param(name)``
    picks the stacked expert tensors (expert on dim 0). The tensors under one parent
    module (the name up to its last dot, e.g. ``layers.3.moe`` for
    ``layers.3.moe.w_in`` and ``layers.3.moe.w_out``) are one layer's experts: the
    norm of expert e is over ALL of its tensors there,
    ``sqrt(sum_p ||grad_p[e]||^2)``, and one scale multiplies all of them (expert e
    of another layer is another expert). Parameters without a gradient are skipped.

    Returns, per parent module, the per-expert norms before clipping ``(E,)``.
    """
    groups: dict[str, list[Tensor]] = {}
    for name, param in named_params:
        if param.grad is not None and is_expert_param(name):
            groups.setdefault(name.rpartition(".")[0], []).append(param.grad)
    norms_by_group: dict[str, Tensor] = {}
    for group, grads in groups.items():
        n_experts = grads[0].shape[0]
        if any(g.shape[0] != n_experts for g in grads):
            raise ValueError(f"expert tensors of {group!r} disagree on the expert count")
        squares = torch.stack(
            [g.reshape(n_experts, -1).float().pow(2).sum(dim=1) for g in grads]
        )  # (P, E)
        norms = squares.sum(dim=0).sqrt()
        scale = _clip_scale(norms, max_norm)
        for g in grads:
            g.mul_(scale.to(g.dtype).view(-1, *([1] * (g.dim() - 1))))
        norms_by_group[group] = norms
    return norms_by_group
