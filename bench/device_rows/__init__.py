"""Rows of the device check (bench/device_check.py) that live in their own modules:
``packed`` (packed runs with and without MPS), ``decode`` (bucketed compiled
decode against eager), ``moe_fused`` (the MoE layer's fused paths against the
dense layer), ``trl`` (TRL's GRPOTrainer against the lab on one checkpoint)."""
