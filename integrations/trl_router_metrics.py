"""Router metrics of a Hugging Face MoE model inside a TRL (or any transformers
``Trainer``) run, logged through the Trainer's own reporting (``report_to="mlflow"``
sends them to the lab; docs/integrations.md).

Forward hooks on the gate modules (``model.layers.{i}.mlp.gate``: transformers 5's
``*TopKRouter``, returning ``(logits, scores, indices)``, or transformers 4's
``nn.Linear`` gate returning the logits, whose top-k this takes with
``config.num_experts_per_tok``) count, per MoE layer, the routed assignments
per expert and the router's entropy over the tokens of the forwards that
build a graph (``torch.is_grad_enabled()``: the policy's training passes,
not generation or no-grad log-prob passes). Padding is left out when the
model's ``attention_mask`` matches the router's tokens. At each Trainer log,
the window since the previous log is reported and reset:

* ``experts/load/L{i}/e{j}``: expert j's share of layer i's assignments (the
  lab joins them into its ``experts/load/L{i}`` vector);
* ``experts/max_violation``: MaxVio = max_e load_e * E / sum(load) - 1, mean
  over layers (trainer/algorithms/measure.py ``max_violation``);
* ``experts/utilization``: share of experts with at least half their fair
  share, mean over layers (trainer/algorithms/measure.py ``utilization``);
* ``experts/router_entropy``: mean over tokens of the router distribution's
  entropy in nats, mean over layers (trainer/algorithms/measure.py ``router_entropy``);
* ``experts/dead``: experts that received no token in the window, summed
  over layers (a dead expert gets no gradient: the collapse the lab watches).

The callback must see ``logs`` before the reporting callbacks do:
``add_router_metrics(trainer)`` puts it first.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import Tensor, nn
from transformers import TrainerCallback

from trainer import metric_keys as mk
from trainer.algorithms.measure import max_violation, utilization

GATE_NAME = re.compile(r"(?:^|\.)layers\.(\d+)\.mlp\.gate$")
DEAD = "experts/dead"


def expert_load_key(layer: int, expert: int) -> str:
    """One expert's share of a layer's load as an MLflow scalar (lab: metric_map.vector_slot)."""
    return f"{mk.experts_load(layer)}/e{expert}"


class _LayerWindow:
    """One MoE layer's routing since the last log: assignments per expert ``(E,)``,
    summed router entropy and tokens."""

    def __init__(self, n_experts: int):
        self.counts = torch.zeros(n_experts, dtype=torch.float64)
        self.entropy_sum = 0.0
        self.tokens = 0

    def add(self, logits: Tensor, indices: Tensor, keep: Tensor | None) -> None:
        """``logits (N, E)``, ``indices (N, k)``, ``keep (N,)`` bool or None."""
        logits = logits.detach().float()
        indices = indices.detach()
        if keep is not None:
            logits, indices = logits[keep], indices[keep]
        if logits.shape[0] == 0:
            return
        probs = torch.softmax(logits, dim=-1)
        self.entropy_sum += float(-torch.special.xlogy(probs, probs).sum(dim=-1).sum())
        self.tokens += logits.shape[0]
        self.counts += torch.bincount(
            indices.reshape(-1).long().cpu(), minlength=self.counts.numel()
        ).to(torch.float64)[: self.counts.numel()]


class RouterMetricsCallback(TrainerCallback):
    """Adds the router metrics of the model's MoE layers to every Trainer log."""

    def __init__(self) -> None:
        self.windows: dict[int, _LayerWindow] = {}
        self.handles: list[Any] = []
        self._mask: Tensor | None = None

    # -- hooks ---------------------------------------------------------------
    def attach(self, model: nn.Module) -> int:
        """Hook every gate of ``model``; returns the MoE layers found."""
        self.detach()
        top_k = int(getattr(getattr(model, "config", None), "num_experts_per_tok", 0) or 0)
        for name, module in model.named_modules():
            match = GATE_NAME.search(name)
            if match is None:
                continue
            layer = int(match.group(1))
            self.handles.append(module.register_forward_hook(self._gate_hook(layer, top_k)))
        self.handles.append(model.register_forward_pre_hook(self._remember_mask, with_kwargs=True))
        return len(self.handles) - 1

    def detach(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def _remember_mask(self, module, args, kwargs) -> None:
        mask = kwargs.get("attention_mask")
        self._mask = mask if isinstance(mask, Tensor) else None

    def _gate_hook(self, layer: int, top_k: int):
        def hook(module, inputs, output) -> None:
            if not torch.is_grad_enabled():
                return
            if isinstance(output, tuple):  # transformers 5 router: (logits, scores, indices)
                logits, indices = output[0], output[-1]
            else:  # transformers 4: the gate is a Linear returning logits
                logits = output
                indices = torch.topk(logits, max(top_k, 1), dim=-1).indices
            logits = logits.reshape(-1, logits.shape[-1])
            indices = indices.reshape(logits.shape[0], -1)
            keep = None
            if self._mask is not None and self._mask.numel() == logits.shape[0]:
                keep = self._mask.reshape(-1).bool().to(logits.device)
            window = self.windows.get(layer)
            if window is None:
                window = self.windows[layer] = _LayerWindow(logits.shape[-1])
            window.add(logits, indices, keep)

        return hook

    # -- metrics -------------------------------------------------------------
    def collect(self) -> dict[str, float]:
        """The window's metrics (see the module docstring), then a fresh window."""
        out: dict[str, float] = {}
        windows = {layer: w for layer, w in sorted(self.windows.items()) if w.tokens}
        if not windows:
            return out
        violations, utils, entropies, dead = [], [], [], 0
        for layer, window in windows.items():
            shares = window.counts / window.counts.sum().clamp_min(1.0)
            for expert, share in enumerate(shares.tolist()):
                out[expert_load_key(layer, expert)] = share
            violations.append(max_violation(window.counts))
            utils.append(utilization(window.counts))
            entropies.append(window.entropy_sum / window.tokens)
            dead += int((window.counts == 0).sum())
        out[mk.EXPERTS_MAX_VIOLATION] = sum(violations) / len(violations)
        out[mk.EXPERTS_UTILIZATION] = sum(utils) / len(utils)
        out[mk.EXPERTS_ROUTER_ENTROPY] = sum(entropies) / len(entropies)
        out[DEAD] = float(dead)
        self.windows = {}
        return out

    # -- TrainerCallback -----------------------------------------------------
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is not None and not self.handles:
            self.attach(model)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is not None and not any(k.startswith("eval_") for k in logs):
            logs.update(self.collect())

    def on_train_end(self, args, state, control, **kwargs):
        self.detach()


def add_router_metrics(trainer) -> RouterMetricsCallback:
    """Put a ``RouterMetricsCallback`` first among ``trainer``'s callbacks, so the reporting
    callbacks (MLflow, TensorBoard) see the metrics it adds to each log."""
    callback = RouterMetricsCallback()
    trainer.callback_handler.callbacks.insert(0, callback)
    return callback
