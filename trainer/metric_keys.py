"""The one module of metric keys (docs/design.md, section 3.5).

The trainer writes these keys to ``metrics.jsonl``; the platform stores them;
the dashboards read them. Keys are slash namespaces. Per-layer expert load is
a vector under ``experts/load/L{i}``.

``METRIC_SPECS`` (end of this module) says how each metric is shown: its
title, axis format and unit, whether only an MoE model logs it, and which
section of the run page (and whether the experiment page) charts it. Charting
a new metric on the dashboards is one ``MetricSpec`` entry there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

STEP = "step"

# reward / response
REWARD_MEAN = "reward/mean"
REWARD_ACCURACY = "reward/accuracy"
RESPONSE_LENGTH_MEAN = "response/length_mean"
EVAL_ACCURACY = (
    "eval/accuracy"  # held-out set through the rollout engine, every run.eval_every steps
)
# The learning endpoint: the same held-out set decoded without the engine's gap (an
# engine at the trainer's precision, no router noise: the trainer's own routing).
EVAL_ACCURACY_CLEAN = "eval/accuracy_clean"

# training-inference mismatch, measured by a training forward on rollout tokens
MISMATCH_KL_K1 = "mismatch/kl_k1"  # token mean of -log r, r = pi_train / pi_rollout
MISMATCH_KL_K3 = "mismatch/kl_k3"  # token mean of r - 1 - log r
# Other frameworks' training-inference mismatch signals (lab/tracking/metric_map.py), not
# KLs: the mean |log pi_train - log pi_rollout| and |pi_train - pi_rollout| of the sampled
# tokens (slime, TRL; verl 0.5); the lab's trainer logs the KLs above instead.
MISMATCH_LOGP_ABS_DIFF = "mismatch/logp_abs_diff"
MISMATCH_PROB_ABS_DIFF = "mismatch/prob_abs_diff"
MISMATCH_KL_K3_MAX = "mismatch/kl_k3_max"  # largest per-sequence k3 mean (spikes)
MISMATCH_EXTREME_TOKEN_FRAC = "mismatch/extreme_token_frac"  # max(r, 1/r) > 2
MISMATCH_ROUTING_INCONSISTENCY = "mismatch/routing_inconsistency"  # (token, layer) pairs
MISMATCH_TOKEN_ANY_LAYER_FRAC = "mismatch/token_any_layer_frac"
MISMATCH_SDI = "mismatch/sdi"  # mean over sequences of share of mismatched tokens
MISMATCH_EFFECTIVE_ROUTING_INCONSISTENCY = "mismatch/effective_routing_inconsistency"

# experts
# + the model's block index (a model with dense blocks logs only its MoE ones)
EXPERTS_LOAD_PREFIX = "experts/load/L"  # -> list[float] of length E


def experts_load(layer: int) -> str:
    return f"{EXPERTS_LOAD_PREFIX}{layer}"


EXPERTS_UTILIZATION = "experts/utilization"
EXPERTS_MAX_VIOLATION = "experts/max_violation"
EXPERTS_ROUTER_ENTROPY = "experts/router_entropy"
ROUTER_TEMPERATURE = "router/temperature"
# The routers' selection bias (auxiliary-loss-free balancing, Wang et al. 2024;
# DeepSeek-V3's e_score_correction_bias) after the step's update: the mean over MoE
# layers of mean_e |b_e| and of max_e b_e - min_e b_e. Logged while the stabilizer
# trains it (stabilizers.balance.aux_free_bias) or the model carries one.
ROUTER_SELECTION_BIAS_ABS_MEAN = "router/selection_bias_abs_mean"
ROUTER_SELECTION_BIAS_SPREAD = "router/selection_bias_spread"

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
# How degraded the importance-sampling estimator is by the engine gap, as verl's
# rollout-correction metrics and slime's train/rollout diagnostics log it:
# rho = pi_old / pi_rollout per response token, w = prod rho per sequence.
IS_CHI2_TOKEN = "is/chi2_token"  # E[rho^2] - 1 (chi-square divergence, token level)
IS_CHI2_SEQ = "is/chi2_seq"  # E[w^2] - 1 (sequence level)
IS_ESS_TOKEN = "is/ess_token"  # (sum rho)^2 / (N sum rho^2), in (0, 1]
IS_ESS_SEQ = "is/ess_seq"  # the same over sequence weights w
IS_SEQ_LOG_RATIO_MEAN = "is/seq_log_ratio_mean"  # mean of log w
IS_SEQ_LOG_RATIO_ABS = "is/seq_log_ratio_abs"  # mean of |log w|
IS_SEQ_LOG_RATIO_MAX = "is/seq_log_ratio_max"  # largest |log w|
# The gap between the policy being updated and the rollout, on each minibatch's
# tokens (k3 of pi_theta vs pi_rollout): it grows through the off-policy minibatches.
POLICY_ROLLOUT_K3 = "policy/rollout_k3"
# The clip share of each step's first minibatch, before any update of that step:
# with rollout behaviour log-probs it is what the clip spends on the engine gap alone.
POLICY_CLIP_FRAC_FIRST = "policy/clip_frac_first_minibatch"
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
# Seconds to load the policy's weights into the rollout engine this step (part of
# time/rollout_s), as RL systems that separate training and inference report it.
TIME_WEIGHT_SYNC_S = "time/weight_sync_s"
# Wall-clock time the step's metrics were written (unix seconds): the charts' time axes
TIME_WALL = "time/wall"
THROUGHPUT_TOKENS_PER_S = "throughput/tokens_per_s"

# warm start: the supervised phase before step 0, reported in RUN_DIR/progress.json
# (trainer/run_folder/warmstart_progress.py), never in metrics.jsonl, whose lines are RL steps only.
PHASE = "phase"  # progress.json: "warmstart" while the base policy trains, then "training"
PHASE_WARMSTART = "warmstart"
PHASE_TRAINING = "training"
WARMSTART_STEP = "warmstart/step"  # SFT steps done
WARMSTART_MAX_STEPS = "warmstart/max_steps"  # warm_start.max_steps: the most it may take
WARMSTART_LOSS = "warmstart/loss"
WARMSTART_ACCURACY = "warmstart/accuracy"  # greedy held-out accuracy at the last check
WARMSTART_TARGET = "warmstart/target"  # warm_start.target_accuracy_low: where it stops
WARMSTART_ETA_S = "warmstart/eta_s"  # seconds left, estimated (null: not known yet)
WARMSTART_CACHED = "warmstart/cached"  # true: the base policy came from the cache
WARMSTART_KEYS: tuple[str, ...] = (
    WARMSTART_STEP,
    WARMSTART_MAX_STEPS,
    WARMSTART_LOSS,
    WARMSTART_ACCURACY,
    WARMSTART_TARGET,
    WARMSTART_ETA_S,
    WARMSTART_CACHED,
)

SCALAR_KEYS: tuple[str, ...] = (
    REWARD_MEAN,
    REWARD_ACCURACY,
    RESPONSE_LENGTH_MEAN,
    EVAL_ACCURACY,
    EVAL_ACCURACY_CLEAN,
    MISMATCH_KL_K1,
    MISMATCH_KL_K3,
    MISMATCH_LOGP_ABS_DIFF,
    MISMATCH_PROB_ABS_DIFF,
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
    ROUTER_SELECTION_BIAS_ABS_MEAN,
    ROUTER_SELECTION_BIAS_SPREAD,
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
    IS_CHI2_TOKEN,
    IS_CHI2_SEQ,
    IS_ESS_TOKEN,
    IS_ESS_SEQ,
    IS_SEQ_LOG_RATIO_MEAN,
    IS_SEQ_LOG_RATIO_ABS,
    IS_SEQ_LOG_RATIO_MAX,
    POLICY_ROLLOUT_K3,
    POLICY_CLIP_FRAC_FIRST,
    R3_REPLAYED_FRAC,
    R3_BYTES_PER_TOKEN_LAYER,
    OPTIM_LR,
    OPTIM_BATCH_SIZE,
    OPTIM_ENTROPY_COEF,
    TIME_ROLLOUT_S,
    TIME_MISMATCH_S,
    TIME_TRAIN_S,
    TIME_STEP_S,
    TIME_WEIGHT_SYNC_S,
    TIME_WALL,
    THROUGHPUT_TOKENS_PER_S,
)


# A distribution imported from a TensorBoard histogram (lab/tracking/tensorboard.py):
# "dist/" + the tag -> its values at DISTRIBUTION_PERCENTS of its mass (TensorBoard's
# distribution bands: min, -2, -1.5, -1, -0.5 sigma ... of a normal, max)
DISTRIBUTION_PREFIX = "dist/"
DISTRIBUTION_PERCENTS = (0.0, 6.68, 15.87, 30.85, 50.0, 69.15, 84.13, 93.32, 100.0)


# The names the metric store reads back (charts, the API): MLflow's metric-name alphabet
# (letters, digits, _ - . / : and spaces: TRL's "profiling/Time taken: ...") and what
# TensorBoard tags add ("@": verl's "reward/mean@1"; = + % # ( ) [ ]), up to the store's
# 200-character key; never a double quote (SQLite reads a key as the JSON path $."key")
# nor a comma (the API's key lists).
METRIC_NAME = re.compile(r"[A-Za-z0-9_./: @=+%#()\[\]-]{1,200}")


def is_vector_key(key: str) -> bool:
    """Per-layer expert-load vectors and imported distributions are the non-scalar metrics."""
    return key.startswith((EXPERTS_LOAD_PREFIX, DISTRIBUTION_PREFIX))


# Summary fields (RUN_DIR/summary.json, docs/design.md 3.4)
SUMMARY_FIELDS: tuple[str, ...] = (
    "status",  # succeeded | failed | cancelled
    "collapsed",
    "collapse_step",
    "collapse_reason",
    "final_accuracy",
    "best_accuracy",
    "initial_accuracy",
    "final_accuracy_clean",  # the same, decoded without the engine's gap (the endpoint)
    "best_accuracy_clean",
    "initial_accuracy_clean",
    "steps",
    "wall_time_s",
)


# --------------------------------------------------------------------------- display registry
@dataclass(frozen=True)
class MetricSpec:
    """How the dashboards show one scalar metric.

    key: the metric key. title: the chart's title and y-axis label.
    unit: "share" for a fraction in [0, 1] (a percent axis that never goes below
    0), else a free-text unit ("s", "tokens/s") shown after the title, or "".
    moe_only: a dense model never logs it (its charts are left out there).
    section: the run page section that charts it (one of RUN_PAGE_SECTIONS, or a
    new title, shown after those); None: not charted on the run page.
    experiment_page: also charted on the experiment page (variants over seeds).
    log_scale: a logarithmic y axis (quantities spanning orders of magnitude).
    scale: values are shown multiplied by it, the unit naming it ("×1e-3"): one
    notation on every chart and table (never Plotly's SI prefixes, "40μ").
    """

    key: str
    title: str
    unit: str = ""
    moe_only: bool = False
    section: str | None = None
    experiment_page: bool = False
    log_scale: bool = False
    scale: float = 1.0

    @property
    def is_share(self) -> bool:
        return self.unit == "share"

    @property
    def axis_format(self) -> str:
        """Plotly tickformat of the y axis ("" lets Plotly choose)."""
        return ".0%" if self.is_share else ""

    @property
    def hover_format(self) -> str:
        return ".2%" if self.is_share else ".4g"

    @property
    def axis_title(self) -> str:
        return f"{self.title} ({self.unit})" if self.unit and not self.is_share else self.title

    @property
    def bounds(self) -> tuple[float | None, float | None]:
        """The values the metric can take by its definition, (low, high), None where
        unbounded: a share lies in [0, 1]; ``PHYSICAL_BOUNDS`` holds the others. A
        chart's axis never runs past them, and a band is cut at them."""
        if self.is_share:
            return (0.0, 1.0)
        return PHYSICAL_BOUNDS.get(self.key, (None, None))


# The run page's sections, in page order.
SECTION_REWARD = "Reward and accuracy"
SECTION_MISMATCH = "Training-inference mismatch"
SECTION_BALANCE = "Expert balance"
SECTION_TEMPERATURE = "Router temperature"
SECTION_GRADIENTS = "Gradients"
SECTION_CLIPPING = "Clipping and importance sampling"
SECTION_ESTIMATOR = "Off-policy estimator"
RUN_PAGE_SECTIONS: tuple[str, ...] = (
    SECTION_REWARD,
    SECTION_MISMATCH,
    SECTION_BALANCE,
    SECTION_TEMPERATURE,
    SECTION_GRADIENTS,
    SECTION_CLIPPING,
    SECTION_ESTIMATOR,
)

SHARE = "share"
# Training-inference KL is ~1e-5..1e-2: shown in thousandths everywhere.
KL_UNIT = "×1e-3"
KL_SCALE = 1e3

# Registry order is chart order within a section and on the experiment page.
_SPECS: tuple[MetricSpec, ...] = (
    MetricSpec(REWARD_MEAN, "mean reward", section=SECTION_REWARD),
    MetricSpec(
        REWARD_ACCURACY,
        "accuracy (train batch)",
        SHARE,
        section=SECTION_REWARD,
        experiment_page=True,
    ),
    MetricSpec(
        EVAL_ACCURACY,
        "accuracy (held-out, rollout engine)",
        SHARE,
        section=SECTION_REWARD,
        experiment_page=True,
    ),
    MetricSpec(
        EVAL_ACCURACY_CLEAN,
        "accuracy (held-out, no engine gap)",
        SHARE,
        section=SECTION_REWARD,
        experiment_page=True,
    ),
    MetricSpec(RESPONSE_LENGTH_MEAN, "mean response length", "tokens"),
    MetricSpec(
        MISMATCH_KL_K1,
        "training-inference KL (k1)",
        KL_UNIT,
        section=SECTION_MISMATCH,
        scale=KL_SCALE,
    ),
    MetricSpec(
        MISMATCH_KL_K3,
        "training-inference KL (k3)",
        KL_UNIT,
        section=SECTION_MISMATCH,
        experiment_page=True,
        scale=KL_SCALE,
    ),
    MetricSpec(MISMATCH_KL_K3_MAX, "largest per-sequence KL (k3)", KL_UNIT, scale=KL_SCALE),
    MetricSpec(
        MISMATCH_LOGP_ABS_DIFF,
        "training-inference |log-prob difference|",
        KL_UNIT,
        section=SECTION_MISMATCH,
        scale=KL_SCALE,
    ),
    MetricSpec(
        MISMATCH_PROB_ABS_DIFF,
        "training-inference |probability difference|",
        KL_UNIT,
        section=SECTION_MISMATCH,
        scale=KL_SCALE,
    ),
    MetricSpec(
        MISMATCH_EXTREME_TOKEN_FRAC,
        "extreme-token share",
        SHARE,
        section=SECTION_MISMATCH,
        experiment_page=True,
    ),
    MetricSpec(
        MISMATCH_ROUTING_INCONSISTENCY,
        "routing inconsistency",
        SHARE,
        moe_only=True,
        section=SECTION_MISMATCH,
        experiment_page=True,
    ),
    MetricSpec(
        MISMATCH_TOKEN_ANY_LAYER_FRAC,
        "tokens routed differently in any layer",
        SHARE,
        moe_only=True,
    ),
    MetricSpec(MISMATCH_SDI, "sequence disagreement index", SHARE, moe_only=True),
    MetricSpec(
        MISMATCH_EFFECTIVE_ROUTING_INCONSISTENCY,
        MISMATCH_EFFECTIVE_ROUTING_INCONSISTENCY,
        SHARE,
        moe_only=True,
    ),
    MetricSpec(EXPERTS_UTILIZATION, "expert utilization", moe_only=True),
    MetricSpec(
        EXPERTS_MAX_VIOLATION,
        "MaxVio",
        moe_only=True,
        section=SECTION_BALANCE,
        experiment_page=True,
    ),
    MetricSpec(EXPERTS_ROUTER_ENTROPY, "router entropy", moe_only=True, section=SECTION_BALANCE),
    MetricSpec(
        ROUTER_TEMPERATURE, "router temperature", moe_only=True, section=SECTION_TEMPERATURE
    ),
    MetricSpec(POLICY_GRAD_NORM, "gradient norm", section=SECTION_GRADIENTS, experiment_page=True),
    MetricSpec(
        ROUTER_SELECTION_BIAS_ABS_MEAN,
        "selection bias, mean |b|",
        moe_only=True,
        section=SECTION_BALANCE,
    ),
    MetricSpec(
        ROUTER_SELECTION_BIAS_SPREAD,
        "selection bias, max - min",
        moe_only=True,
        section=SECTION_BALANCE,
    ),
    MetricSpec(
        GRADS_COS_POLICY_AUX,
        "cos(policy grad, aux grad)",
        moe_only=True,
        section=SECTION_GRADIENTS,
    ),
    MetricSpec(
        GRADS_SURGERY_FRAC,
        "gradient-surgery share",
        SHARE,
        moe_only=True,
        section=SECTION_GRADIENTS,
    ),
    MetricSpec(POLICY_CLIP_FRAC, "PPO clip share", SHARE, section=SECTION_CLIPPING),
    MetricSpec(TIS_CLIP_FRAC, "TIS clip share", SHARE, section=SECTION_CLIPPING),
    MetricSpec(TIS_MASKED_FRAC, TIS_MASKED_FRAC, SHARE),
    MetricSpec(R3_REPLAYED_FRAC, R3_REPLAYED_FRAC, SHARE, moe_only=True),
    MetricSpec(
        POLICY_CLIP_FRAC_FIRST,
        "clip share, first minibatch (engine gap only)",
        SHARE,
        section=SECTION_CLIPPING,
    ),
    MetricSpec(IS_CHI2_TOKEN, "chi-square, token (E[rho^2] - 1)", section=SECTION_ESTIMATOR),
    MetricSpec(IS_CHI2_SEQ, "chi-square, sequence (E[w^2] - 1)", section=SECTION_ESTIMATOR),
    MetricSpec(IS_ESS_TOKEN, "effective sample size, token", SHARE, section=SECTION_ESTIMATOR),
    MetricSpec(IS_ESS_SEQ, "effective sample size, sequence", SHARE, section=SECTION_ESTIMATOR),
    MetricSpec(IS_SEQ_LOG_RATIO_ABS, "mean |sequence log-ratio|", section=SECTION_ESTIMATOR),
    MetricSpec(IS_SEQ_LOG_RATIO_MAX, "largest |sequence log-ratio|", section=SECTION_ESTIMATOR),
    MetricSpec(IS_SEQ_LOG_RATIO_MEAN, "mean sequence log-ratio"),
    MetricSpec(
        POLICY_ROLLOUT_K3,
        "KL (k3) of the updated policy to the rollout",
        KL_UNIT,
        section=SECTION_ESTIMATOR,
        scale=KL_SCALE,
    ),
)

# What a metric can be by its definition, beyond shares (in [0, 1]): k3 = r - 1 - log r
# >= 0 per token; norms, entropies, lengths, temperatures, |log-ratios| and MaxVio
# ((max load - mean) / mean) are >= 0; a cosine lies in [-1, 1]. k1 = -log r and the
# chi-square estimates can go below 0 and are not listed.
PHYSICAL_BOUNDS: dict[str, tuple[float | None, float | None]] = {
    **{
        key: (0.0, None)
        for key in (
            MISMATCH_KL_K3,
            MISMATCH_KL_K3_MAX,
            POLICY_ROLLOUT_K3,
            RESPONSE_LENGTH_MEAN,
            EXPERTS_UTILIZATION,
            EXPERTS_MAX_VIOLATION,
            EXPERTS_ROUTER_ENTROPY,
            ROUTER_TEMPERATURE,
            POLICY_GRAD_NORM,
            IS_SEQ_LOG_RATIO_ABS,
            IS_SEQ_LOG_RATIO_MAX,
        )
    },
    GRADS_COS_POLICY_AUX: (-1.0, 1.0),
}

# key -> spec. The dashboards read it at call time, so an added entry shows up
# without any other change.
METRIC_SPECS: dict[str, MetricSpec] = {spec.key: spec for spec in _SPECS}


def metric_spec(key: str) -> MetricSpec:
    """The key's spec; an unlisted key (or a per-layer load vector) gets a plain one."""
    if key in METRIC_SPECS:
        return METRIC_SPECS[key]
    if is_vector_key(key):
        return MetricSpec(key, f"expert load, layer {key.removeprefix(EXPERTS_LOAD_PREFIX)}")
    return MetricSpec(key, key)
