"""The one module of metric keys (DESIGN.md 3.4).

The trainer writes these keys to ``metrics.jsonl``; the platform stores them;
the dashboards read them. Keys are slash namespaces. Per-layer expert load is
a vector under ``experts/load/L{i}``.
"""

from __future__ import annotations

STEP = "step"

# reward / response
REWARD_MEAN = "reward/mean"
REWARD_ACCURACY = "reward/accuracy"
RESPONSE_LENGTH_MEAN = "response/length_mean"
EVAL_ACCURACY = "eval/accuracy"  # held-out set, every run.eval_every steps

# training-inference mismatch, measured by a training forward on rollout tokens
MISMATCH_KL_K1 = "mismatch/kl_k1"  # token mean of -log r, r = pi_train / pi_rollout
MISMATCH_KL_K3 = "mismatch/kl_k3"  # token mean of r - 1 - log r
MISMATCH_KL_K3_MAX = "mismatch/kl_k3_max"  # largest per-sequence k3 mean (spikes)
MISMATCH_EXTREME_TOKEN_FRAC = "mismatch/extreme_token_frac"  # max(r, 1/r) > 2
MISMATCH_ROUTING_INCONSISTENCY = "mismatch/routing_inconsistency"  # (token, layer) pairs
MISMATCH_TOKEN_ANY_LAYER_FRAC = "mismatch/token_any_layer_frac"
MISMATCH_SDI = "mismatch/sdi"  # mean over sequences of share of mismatched tokens
MISMATCH_EFFECTIVE_ROUTING_INCONSISTENCY = "mismatch/effective_routing_inconsistency"

# experts
EXPERTS_LOAD_PREFIX = "experts/load/L"  # + layer index -> list[float] of length E


def experts_load(layer: int) -> str:
    return f"{EXPERTS_LOAD_PREFIX}{layer}"


EXPERTS_UTILIZATION = "experts/utilization"
EXPERTS_MAX_VIOLATION = "experts/max_violation"
EXPERTS_ROUTER_ENTROPY = "experts/router_entropy"
ROUTER_TEMPERATURE = "router/temperature"

# policy / value
POLICY_LOSS = "policy/loss"
POLICY_KL_REF = "policy/kl_ref"
POLICY_ENTROPY = "policy/entropy"
POLICY_CLIP_FRAC = "policy/clip_frac"
POLICY_RATIO_MAX = "policy/ratio_max"
POLICY_GRAD_NORM = "policy/grad_norm"
VALUE_LOSS = "value/loss"

# stabilizers
LB_AUX_LOSS = "lb/aux_loss"
LB_Z_LOSS = "lb/z_loss"
LB_ROUTER_KL = "lb/router_kl"
GRADS_COS_POLICY_AUX = "grads/cos_policy_aux"
GRADS_SURGERY_FRAC = "grads/surgery_frac"
TIS_CLIP_FRAC = "tis/clip_frac"
TIS_RATIO_MEAN = "tis/ratio_mean"
TIS_RATIO_MAX = "tis/ratio_max"
TIS_MASKED_FRAC = "tis/masked_frac"
R3_REPLAYED_FRAC = "r3/replayed_frac"
R3_BYTES_PER_TOKEN_LAYER = "r3/bytes_per_token_layer"

# optimisation
OPTIM_LR = "optim/lr"
OPTIM_BATCH_SIZE = "optim/batch_size"
OPTIM_ENTROPY_COEF = "optim/entropy_coef"

# time
TIME_ROLLOUT_S = "time/rollout_s"
TIME_MISMATCH_S = "time/mismatch_s"
TIME_TRAIN_S = "time/train_s"
TIME_STEP_S = "time/step_s"
THROUGHPUT_TOKENS_PER_S = "throughput/tokens_per_s"

SCALAR_KEYS: tuple[str, ...] = (
    REWARD_MEAN,
    REWARD_ACCURACY,
    RESPONSE_LENGTH_MEAN,
    EVAL_ACCURACY,
    MISMATCH_KL_K1,
    MISMATCH_KL_K3,
    MISMATCH_KL_K3_MAX,
    MISMATCH_EXTREME_TOKEN_FRAC,
    MISMATCH_ROUTING_INCONSISTENCY,
    MISMATCH_TOKEN_ANY_LAYER_FRAC,
    MISMATCH_SDI,
    MISMATCH_EFFECTIVE_ROUTING_INCONSISTENCY,
    EXPERTS_UTILIZATION,
    EXPERTS_MAX_VIOLATION,
    EXPERTS_ROUTER_ENTROPY,
    ROUTER_TEMPERATURE,
    POLICY_LOSS,
    POLICY_KL_REF,
    POLICY_ENTROPY,
    POLICY_CLIP_FRAC,
    POLICY_RATIO_MAX,
    POLICY_GRAD_NORM,
    VALUE_LOSS,
    LB_AUX_LOSS,
    LB_Z_LOSS,
    LB_ROUTER_KL,
    GRADS_COS_POLICY_AUX,
    GRADS_SURGERY_FRAC,
    TIS_CLIP_FRAC,
    TIS_RATIO_MEAN,
    TIS_RATIO_MAX,
    TIS_MASKED_FRAC,
    R3_REPLAYED_FRAC,
    R3_BYTES_PER_TOKEN_LAYER,
    OPTIM_LR,
    OPTIM_BATCH_SIZE,
    OPTIM_ENTROPY_COEF,
    TIME_ROLLOUT_S,
    TIME_MISMATCH_S,
    TIME_TRAIN_S,
    TIME_STEP_S,
    THROUGHPUT_TOKENS_PER_S,
)


def is_vector_key(key: str) -> bool:
    """Per-layer expert-load vectors are the only non-scalar metrics."""
    return key.startswith(EXPERTS_LOAD_PREFIX)


# Summary fields (RUN_DIR/summary.json, DESIGN.md 3.2)
SUMMARY_FIELDS: tuple[str, ...] = (
    "status",  # succeeded | failed | cancelled
    "collapsed",
    "collapse_step",
    "collapse_reason",
    "final_accuracy",
    "best_accuracy",
    "initial_accuracy",
    "steps",
    "wall_time_s",
)
