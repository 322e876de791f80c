"""Low-precision training parameters with fp32 master weights (``optim.param_dtype``).

Mixed-precision training (Micikevicius et al. 2018, "Mixed Precision
Training"): the policy stores its weights in bf16, so its forward and backward
read half the bytes, while AdamW updates an fp32 master copy of each bf16
weight with fp32 moments; after every step the masters are rounded back into
the policy. An update far below bf16's resolution (8 bits of mantissa:
relative step 2^-8) is kept in the master and shows once it accumulates,
instead of being rounded away every step.

The routers stay fp32 parameters (no master needed): their logits and softmax
are computed in fp32 anyway (``Router.logits``), and top-k selection is where
precision decides the experts a token sees.

Memory per parameter: bf16 weight 2 + bf16 gradient 2 + fp32 master 4 + fp32
Adam moments 8 = 16 bytes (fp32 training: 4 + 4 + 8 = 16); what bf16 saves is
activation memory and bandwidth, not optimizer memory.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from trainer.devices.dtypes import DTYPES  # optim.param_dtype takes fp32 | bf16


def keeps_fp32(name: str) -> bool:
    """Parameters that stay fp32 whatever ``optim.param_dtype``: the routers."""
    return ".router." in name


def cast_parameters(model: nn.Module, param_dtype: str) -> None:
    """Store every parameter but the routers' in ``param_dtype`` (in place)."""
    dtype = DTYPES[param_dtype]
    for name, param in model.named_parameters():
        if not keeps_fp32(name) and param.dtype != dtype:
            param.data = param.data.to(dtype)


class MasterWeights:
    """fp32 masters of a model's low-precision parameters; the optimiser steps the masters.

    Per update: ``grads_to_masters()`` after the backward (and after anything
    that edits the model's gradients), the optimiser step on ``optimizer_param``
    of each parameter, then ``masters_to_params()``. A model without
    low-precision parameters has no masters and every call is a no-op.
    """

    def __init__(self, model: nn.Module) -> None:
        self.pairs: list[tuple[nn.Parameter, nn.Parameter]] = [
            (param, nn.Parameter(param.detach().float().clone()))
            for param in model.parameters()
            if param.dtype != torch.float32
        ]
        self._master_of = {id(param): master for param, master in self.pairs}

    def optimizer_param(self, param: nn.Parameter) -> nn.Parameter:
        """What the optimiser updates for ``param``: its fp32 master, or itself."""
        return self._master_of.get(id(param), param)

    def grads_to_masters(self) -> None:
        for param, master in self.pairs:
            master.grad = None if param.grad is None else param.grad.float()

    def masters_to_params(self) -> None:
        with torch.no_grad():
            for param, master in self.pairs:
                param.copy_(master)  # rounds to the parameter's dtype

    def zero_model_grads(self) -> None:
        for param, _ in self.pairs:
            param.grad = None

    def state_dict(self) -> dict[str, Any]:
        return {"masters": [master.detach().clone() for _, master in self.pairs]}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Restore the masters; a checkpoint without them (saved by an fp32 run)
        starts them from the current parameters."""
        saved = (state or {}).get("masters")
        with torch.no_grad():
            for index, (param, master) in enumerate(self.pairs):
                master.copy_(saved[index] if saved else param.float())
