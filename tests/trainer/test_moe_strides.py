"""grouped_mm's 16-byte row-stride rule, checked before the kernel runs: an
expert width or hidden size whose rows are not a multiple of 16 bytes runs on
the loop backend (same result) and the fallback is recorded, where torch's
kernel would raise "strides should be multiple of 16 bytes"."""

from __future__ import annotations

import pytest
import torch

from trainer.model import dispatch
from trainer.model.dispatch import (
    experts_swiglu,
    grouped_mm_fallbacks,
    grouped_mm_stride_problem,
    resolve_backend,
)

pytestmark = pytest.mark.skipif(
    not dispatch.grouped_mm_supported(torch.zeros(1)), reason="no grouped_mm kernel here"
)


def test_stride_rule_by_hand():
    assert grouped_mm_stride_problem((64, 32), 4) is None  # 256 and 128 bytes
    assert grouped_mm_stride_problem((8,), 2) is None  # 16 bytes
    assert "[12]" in grouped_mm_stride_problem((64, 12), 2)  # 24 bytes


def test_torch_refuses_these_strides():
    x = torch.randn(8, 12, dtype=torch.bfloat16)
    w = torch.randn(2, 12, 32, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="16 bytes"):
        dispatch._grouped_mm(x, w, offs=torch.tensor([4, 8], dtype=torch.int32))


@pytest.mark.parametrize(("d_model", "hidden"), [(12, 32), (32, 12)])
def test_bad_widths_fall_back_to_the_loop_and_are_recorded(d_model, hidden):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(10, d_model, generator=gen).bfloat16()
    w_gate, w_up = (torch.randn(4, d_model, hidden, generator=gen).bfloat16() for _ in "gu")
    w_down = torch.randn(4, hidden, d_model, generator=gen).bfloat16()
    indices = torch.randint(0, 4, (10, 2), generator=gen)
    gates = torch.rand(10, 2, generator=gen)
    dispatch._FALLBACKS.clear()  # the warning is given once per reason and process
    with pytest.warns(RuntimeWarning, match="grouped_mm -> loop"):
        auto = experts_swiglu(x, gates, indices, w_gate, w_up, w_down, backend="auto")
    loop = experts_swiglu(x, gates, indices, w_gate, w_up, w_down, backend="loop")
    assert torch.equal(auto, loop)
    bad = d_model if d_model % 8 else hidden
    assert any(f"[{bad}]" in message for message in grouped_mm_fallbacks())
    assert resolve_backend("auto", x, widths=(hidden,)) == "loop"


def test_good_widths_keep_grouped_mm():
    x = torch.randn(4, 32).bfloat16()
    assert resolve_backend("auto", x, widths=(64,)) == "grouped_mm"
