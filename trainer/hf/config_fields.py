"""Reading a checkpoint's config.json fields: the error helpers every family mapping
uses and the rotary fields (``rope_parameters`` / ``rope_scaling``), resolved as
transformers resolves them. Torch-free.
"""

from __future__ import annotations

import math
from typing import Any

from trainer.errors import FieldError

SOURCE = "model.source"


def unsupported(field: str, value: Any, why: str) -> tuple[str, str]:
    return (SOURCE, f"config.json field {field}={value!r} is not supported: {why}")


def require(hf: dict[str, Any], key: str) -> Any:
    if hf.get(key) is None:
        raise FieldError([(SOURCE, f"config.json has no {key!r}, which this family needs")])
    return hf[key]


SCALED_ROPE_KINDS = ("linear", "dynamic", "yarn", "llama3")


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN eq. 21: 0.1 * mscale * ln(scale) + 1 (1 for scale <= 1)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_params(hf: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint's rope dict: transformers 5's convert_rope_params_to_dict takes a
    ``rope_scaling`` dict over ``rope_parameters``."""
    params = hf.get("rope_scaling")
    if not isinstance(params, dict):
        params = hf.get("rope_parameters")
    return dict(params) if isinstance(params, dict) else {}


def rotary_fraction_of(hf: dict[str, Any]) -> float:
    """``partial_rotary_factor`` (in the rope dict or at the top level; 1 = every dim)."""
    params = rope_params(hf)
    partial = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    return 1.0 if partial is None else float(partial)


def rope_fields_of(
    hf: dict[str, Any], partial_rotary: bool = False, latent: bool = False
) -> tuple[float, dict[str, Any]]:
    """(rope_theta, rope_scaling fields) from ``rope_parameters`` (transformers 5) or
    ``rope_theta`` + ``rope_scaling`` (transformers 4), resolved as transformers'
    ``standardize_rope_params`` and ``ROPE_INIT_FUNCTIONS`` do; longrope and per-layer
    rope parameters are refused, and partial rotary unless the family applies it
    (``partial_rotary``: GLM-4.5). ``latent``: a latent-attention family, whose yarn
    ``mscale_all_dim`` also scales the attention softmax (kept in the fields)."""
    # The base falls back to rope_theta, then the class default.
    params = rope_params(hf)
    errors = []
    if any(isinstance(v, dict) for v in params.values()):
        errors.append(
            unsupported("rope_parameters", params, "one rope for every layer is implemented")
        )
        raise FieldError(errors)
    kind = params.get("rope_type", params.get("type", "default"))
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    if kind not in ("default", *SCALED_ROPE_KINDS):
        errors.append(
            unsupported(
                "rope_parameters.rope_type",
                kind,
                "implemented: default, " + ", ".join(SCALED_ROPE_KINDS),
            )
        )
    partial = rotary_fraction_of(hf)
    if partial != 1.0 and not partial_rotary:
        errors.append(unsupported("partial_rotary_factor", partial, "rotary covers every dim"))
    if errors:
        raise FieldError(errors)
    scaling: dict[str, Any] = {"kind": kind}
    if kind == "default":
        return theta, scaling
    max_pos = hf.get("max_position_embeddings")
    original = hf.get("original_max_position_embeddings") or params.get(
        "original_max_position_embeddings", max_pos
    )
    factor = params.get("factor")
    if kind == "yarn" and factor is None and max_pos and original:
        factor = max_pos / original
    if factor is None:
        raise FieldError([(SOURCE, f"config.json rope scaling {kind!r} has no factor")])
    scaling["factor"] = float(factor)
    if kind == "dynamic":
        scaling["max_positions"] = max_pos
    elif kind == "llama3":
        scaling.update(
            max_positions=original,
            low_freq_factor=float(params.get("low_freq_factor", 1.0)),
            high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        )
    elif kind == "yarn":
        attention_factor = params.get("attention_factor")
        mscale, mscale_all = params.get("mscale"), params.get("mscale_all_dim")
        if attention_factor is None and mscale and mscale_all:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all)
        scaling.update(
            max_positions=original,
            beta_fast=float(params.get("beta_fast") or 32),
            beta_slow=float(params.get("beta_slow") or 1),
            attention_factor=None if attention_factor is None else float(attention_factor),
            truncate=bool(params.get("truncate", True)),
        )
        if latent and mscale_all:
            scaling["mscale_all_dim"] = float(mscale_all)
    if kind != "linear" and scaling.get("max_positions") is None:
        raise FieldError(
            [(SOURCE, f"config.json rope scaling {kind!r} needs max_position_embeddings")]
        )
    return theta, scaling


def rope_theta_of(hf: dict[str, Any]) -> float:
    """The rotary base (see ``rope_fields_of``)."""
    return rope_fields_of(hf)[0]
