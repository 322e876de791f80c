"""Count the host syncs a code path would make on a GPU, on any device.

A CUDA kernel launch is asynchronous; the host stalls (a device-to-host
sync) only when it needs a value the device computes. On the CPU nothing
stalls, so the syncs of a code path are invisible there. ``count_syncs``
makes them visible: inside it, every operation that on CUDA has to wait for
the device is counted (and its call site recorded), while it still computes
exactly what it computes without the counter.

What counts as a sync (the value or the output SHAPE depends on device data):

* reading a tensor on the host: ``.item()``, ``bool(t)``, ``int(t)``,
  ``float(t)``, ``t.tolist()``, ``t.numpy()``, ``t.cpu()`` (aten
  ``_local_scalar_dense`` / ``item`` for the scalar reads);
* ops with a data-dependent output shape: ``nonzero``, ``masked_select``,
  boolean-mask indexing and index assignment, ``unique`` and friends,
  ``repeat_interleave`` without ``output_size``;
* ops whose CUDA kernel reads a value on the host: ``bincount`` (its output
  length is ``max + 1``), ``multinomial`` (input checks), ``equal``.

Not counted: ``grouped_mm``, whose syncs depend on the kernel a capability has
(trainer.model.dispatch picks the backend so that it runs only where the
fused kernel exists), and collectives.

    with count_syncs() as syncs:
        model(tokens)
    assert syncs.total == 0, syncs.report()
"""

from __future__ import annotations

import sys
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

# aten overload packets that wait for the device on CUDA (see the module docstring).
_SYNCING_OPS = {
    aten._local_scalar_dense: "item",
    aten.item: "item",
    aten.is_nonzero: "item",
    aten.nonzero: "nonzero",
    aten.masked_select: "masked_select",
    aten.bincount: "bincount",
    aten.multinomial: "multinomial",
    aten.equal: "equal",
    aten._unique: "unique",
    aten._unique2: "unique",
    aten.unique_dim: "unique",
    aten.unique_consecutive: "unique",
}
_BOOL_DTYPES = (torch.bool, torch.uint8)
# repeat_interleave with tensor repeats sizes its output from their sum.
_TENSOR_REPEATS = (aten.repeat_interleave.Tensor, aten.repeat_interleave.self_Tensor)
# Python-level host reads that never reach the dispatcher.
_PATCHED_METHODS = ("tolist", "numpy", "cpu")


@dataclass
class SyncCount:
    """Counted syncs: ``by_kind`` (e.g. {"item": 3}), ``by_phase`` (the label set
    with ``in_phase`` when each happened), and ``sites`` (kind, the innermost
    project frame ``file:line``) for the report."""

    by_kind: Counter = field(default_factory=Counter)
    by_phase: Counter = field(default_factory=Counter)
    sites: list[tuple[str, str]] = field(default_factory=list)
    phase: str = "-"

    @property
    def total(self) -> int:
        return sum(self.by_kind.values())

    def add(self, kind: str) -> None:
        self.by_kind[kind] += 1
        self.by_phase[self.phase] += 1
        self.sites.append((kind, _call_site()))

    @contextmanager
    def in_phase(self, name: str):
        """Label the syncs counted inside the block (nesting restores the outer label)."""
        outer, self.phase = self.phase, name
        try:
            yield self
        finally:
            self.phase = outer

    def report(self) -> str:
        """One line per (kind, call site) with its count, most frequent first."""
        lines = Counter(f"{kind} at {site}" for kind, site in self.sites)
        return "\n".join(f"{n:5d}  {line}" for line, n in lines.most_common())


def _call_site() -> str:
    """The innermost frame of this project (not torch, not this module)."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if "/torch/" not in name and name != __file__:
            return f"{name.rsplit('/', 2)[-2]}/{name.rsplit('/', 1)[-1]}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


def _indexes_with_mask(indices) -> bool:
    return any(isinstance(i, torch.Tensor) and i.dtype in _BOOL_DTYPES for i in indices or ())


class _SyncMode(TorchDispatchMode):
    def __init__(self, count: SyncCount):
        super().__init__()
        self.count = count

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        packet = func.overloadpacket
        kind = _SYNCING_OPS.get(packet)
        if kind is None:
            if packet in (aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_):
                if _indexes_with_mask(args[1] if len(args) > 1 else kwargs.get("indices")):
                    kind = "boolean index"
            elif func in _TENSOR_REPEATS and kwargs.get("output_size") is None:
                kind = "repeat_interleave"
        if kind is not None:
            self.count.add(kind)
        return func(*args, **kwargs)


@contextmanager
def count_syncs():
    """Count the would-be host syncs of everything run inside (one thread).

    Yields a ``SyncCount`` that fills while the block runs. The patched
    methods count only tensors (``tolist``/``numpy``/``cpu``); a scalar read
    inside them (none in torch today) would count once more.
    """
    count = SyncCount()
    originals = {name: getattr(torch.Tensor, name) for name in _PATCHED_METHODS}

    def counted(name):
        original = originals[name]

        def method(self, *args, **kwargs):
            count.add(name)
            return original(self, *args, **kwargs)

        method.__name__ = name
        return method

    for name in _PATCHED_METHODS:
        setattr(torch.Tensor, name, counted(name))
    try:
        with _SyncMode(count):
            yield count
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
