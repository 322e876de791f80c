"""The frameworks' metric names mapped onto the lab's keys (trainer/metric_keys.py): the
one table, as data.

An external run logs under its framework's own names; a name listed here is
stored under the lab key it measures, so the run page's charts, collapse
detection and the stability review read it like a lab run's metric. Every
other name is stored as it is (and charted under that name).

Each entry was read from the framework's source (the file is named in the
comment; commits: verl b178a3c, slime 624b824, TRL f2cd577 and the installed
trl 1.16, OpenRLHF 3c3be62). A name is mapped only where it measures the
same quantity as the lab key:

* lab ``mismatch/kl_k1`` = token mean of log pi_rollout - log pi_train, and
  ``mismatch/kl_k3`` = token mean of r - 1 - log r, r = pi_train / pi_rollout
  (trainer/metric_keys.py). verl's ``rollout_corr/kl`` and ``rollout_corr/k3_kl``
  and OpenRLHF's ``vllm_kl`` are exactly these (verl 0.6.0 named them
  ``mismatch/mismatch_kl`` and ``mismatch_k3_kl``). slime's
  ``train_rollout_logprob_abs_diff`` and TRL's
  ``sampling/sampling_logp_difference/mean`` are the mean ABSOLUTE log-prob
  difference, another quantity, stored under its own lab key
  ``mismatch/logp_abs_diff`` (slime averages each sample's tokens first, TRL all
  tokens); verl 0.5's ``training/rollout_probs_diff_mean``, the mean absolute
  PROBABILITY difference, under ``mismatch/prob_abs_diff``. The review shows the
  best of them a run has, labelled (k3, else k1, else these).
* ``policy/kl_ref`` is the KL to the reference policy (verl ``actor/kl_loss``,
  slime ``train/kl_loss``, TRL ``kl``, OpenRLHF ``kl``), never the PPO
  old-vs-new KL (``ppo_kl``), which has no lab key and stays as it is.

Names arrive through two paths: MLflow (verl's tracker, the Hugging Face
Trainer's ``MLflowCallback``: the names as logged) and TensorBoard event
files (slime's and OpenRLHF's ``SummaryWriter``, the Hugging Face
``TensorBoardCallback``, which prefixes ``train/``). Both spellings are listed
where a framework uses both.

Routing: the lab's Trainer callback (integrations/trl_router_metrics.py)
logs the lab's own keys, with each layer's expert load as one scalar per
expert, ``experts/load/L{layer}/e{expert}`` (MLflow metrics are scalars);
the store (``vector_slot``) joins them back into the lab's ``experts/load/L{layer}``
vector, which the run page's expert-load heatmap reads.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from trainer import metric_keys as mk

VERL = "verl"
SLIME = "slime"
TRL = "trl"
OPENRLHF = "openrlhf"

FRAMEWORK_MAPS: dict[str, dict[str, str]] = {
    VERL: {
        # verl 0.6.0: verl/trainer/ppo/mismatch_helper.py (compute_mismatch_metrics:
        # "mismatch_kl" = mean(rollout_log_prob - old_log_prob), "mismatch_k3_kl" =
        # mean(exp(l) - l - 1), l = old - rollout; compute_rollout_importance_weights:
        # "rollout_is_mean", "rollout_is_max"; all prefixed "mismatch/"). verl 0.5 logs no
        # KL to the rollout engine: its "training/rollout_probs_diff_*" (ray_trainer.py,
        # behind calculate_log_probs) are absolute probability differences, kept as they are.
        "mismatch/mismatch_kl": mk.MISMATCH_KL_K1,
        "mismatch/mismatch_k3_kl": mk.MISMATCH_KL_K3,
        "mismatch/rollout_is_mean": mk.TIS_RATIO_MEAN,
        "mismatch/rollout_is_max": mk.TIS_RATIO_MAX,
        # verl >= 0.6.1: verl/trainer/ppo/rollout_corr_helper.py (compute_offpolicy_metrics: "kl" =
        # mean(rollout_log_prob - old_log_prob), "k3_kl" = mean(exp(l) - l - 1) with
        # l = old - rollout; prefixed "rollout_corr/" by compute_rollout_correction_and_add_to_batch)
        "rollout_corr/kl": mk.MISMATCH_KL_K1,
        "rollout_corr/k3_kl": mk.MISMATCH_KL_K3,
        # verl/trainer/ppo/rollout_corr_helper.py (compute_rollout_correction_weights:
        # "rollout_is_mean", "rollout_is_max" of the truncated IS weights)
        "rollout_corr/rollout_is_mean": mk.TIS_RATIO_MEAN,
        "rollout_corr/rollout_is_max": mk.TIS_RATIO_MAX,
        # verl/trainer/ppo/core_algos.py (compute_policy_loss_vanilla: "actor/pg_clipfrac")
        "actor/pg_clipfrac": mk.POLICY_CLIP_FRAC,
        # verl/workers/actor/dp_actor.py (update_policy: "actor/entropy", "actor/pg_loss",
        # "actor/kl_loss", "actor/grad_norm")
        "actor/entropy": mk.POLICY_ENTROPY,
        "actor/pg_loss": mk.POLICY_LOSS,
        "actor/kl_loss": mk.POLICY_KL_REF,
        "actor/grad_norm": mk.POLICY_GRAD_NORM,
        # verl/workers/fsdp_workers.py (update_actor: metrics["actor/lr"])
        "actor/lr": mk.OPTIM_LR,
        # verl/trainer/ppo/metric_utils.py (compute_data_metrics: "critic/score/mean" is the
        # sequence reward before any KL penalty; "response_length/mean")
        "critic/score/mean": mk.REWARD_MEAN,
        "response_length/mean": mk.RESPONSE_LENGTH_MEAN,
        # verl/trainer/ppo/metric_utils.py (compute_timing_metrics: "timing_s/{name}";
        # ray_trainer.py times "step" and "gen")
        "timing_s/step": mk.TIME_STEP_S,
        "timing_s/gen": mk.TIME_ROLLOUT_S,
        # verl 0.5.0: verl/trainer/ppo/ray_trainer.py (fit, with calculate_log_probs:
        # "training/rollout_probs_diff_mean" = mean |exp(rollout_log_prob) - exp(old_log_prob)|)
        "training/rollout_probs_diff_mean": mk.MISMATCH_PROB_ABS_DIFF,
    },
    SLIME: {
        # slime/backends/megatron_utils/model.py (train: log_dict[f"train/{role_tag}{key}"] of
        # policy_loss_function's reported_loss in slime/backends/megatron_utils/loss.py:
        # "pg_loss", "entropy_loss" (the mean entropy), "pg_clipfrac", "kl_loss", "tis",
        # "tis_clipfrac"; and log_dict["train/grad_norm"])
        "train/pg_loss": mk.POLICY_LOSS,
        "train/entropy_loss": mk.POLICY_ENTROPY,
        "train/pg_clipfrac": mk.POLICY_CLIP_FRAC,
        "train/kl_loss": mk.POLICY_KL_REF,
        "train/tis": mk.TIS_RATIO_MEAN,
        "train/tis_clipfrac": mk.TIS_CLIP_FRAC,
        "train/grad_norm": mk.POLICY_GRAD_NORM,
        # the same file: log_dict[f"train/{role_tag}lr-pg_{param_group_id}"]
        "train/lr-pg_0": mk.OPTIM_LR,
        # slime/backends/megatron_utils/loss.py (with --get-mismatch-metrics:
        # sum_of_sample_mean((log_probs - rollout_log_probs).abs()))
        "train/train_rollout_logprob_abs_diff": mk.MISMATCH_LOGP_ABS_DIFF,
        # slime/observability/train_metric_utils.py (log_rollout_data: gather_log_data("rollout",
        # ...) of rollout_data["raw_reward"] -> "rollout/raw_reward")
        "rollout/raw_reward": mk.REWARD_MEAN,
        # slime/observability/rollout_metrics.py (compute_metrics_from_samples:
        # "response_len/" + compute_statistics -> "rollout/response_len/mean";
        # compute_perf_metrics_from_samples: "rollout_time" under "perf/")
        "rollout/response_len/mean": mk.RESPONSE_LENGTH_MEAN,
        "perf/rollout_time": mk.TIME_ROLLOUT_S,
    },
    TRL: {
        # trl/trainer/grpo_trainer.py (_generate_and_score_completions / _compute_loss:
        # self._metrics[mode]["reward"], ["kl"], ["entropy"], ["clip_ratio/region_mean"],
        # ["completions/mean_length"], ["sampling/importance_sampling_ratio/mean|max"]);
        # logged as they are by transformers' MLflowCallback (on_log)
        "reward": mk.REWARD_MEAN,
        "kl": mk.POLICY_KL_REF,
        "entropy": mk.POLICY_ENTROPY,
        "clip_ratio/region_mean": mk.POLICY_CLIP_FRAC,
        "completions/mean_length": mk.RESPONSE_LENGTH_MEAN,
        "sampling/importance_sampling_ratio/mean": mk.TIS_RATIO_MEAN,
        "sampling/importance_sampling_ratio/max": mk.TIS_RATIO_MAX,
        # the same file: mean |old_per_token_logps - sampling_per_token_logps| over tokens
        "sampling/sampling_logp_difference/mean": mk.MISMATCH_LOGP_ABS_DIFF,
        # trl/trainer/grpo_trainer.py (f"rewards/{reward_func_name}/mean") with
        # trl/rewards/accuracy_rewards.py (def accuracy_reward: 1.0 right, 0.0 wrong)
        "rewards/accuracy_reward/mean": mk.REWARD_ACCURACY,
        # transformers/trainer.py (_maybe_log_save_evaluate: logs["loss"], ["grad_norm"],
        # ["learning_rate"])
        "loss": mk.POLICY_LOSS,
        "grad_norm": mk.POLICY_GRAD_NORM,
        "learning_rate": mk.OPTIM_LR,
        # the same through transformers' TensorBoardCallback (rewrite_logs: "train/" prefix)
        "train/reward": mk.REWARD_MEAN,
        "train/kl": mk.POLICY_KL_REF,
        "train/entropy": mk.POLICY_ENTROPY,
        "train/clip_ratio/region_mean": mk.POLICY_CLIP_FRAC,
        "train/completions/mean_length": mk.RESPONSE_LENGTH_MEAN,
        "train/rewards/accuracy_reward/mean": mk.REWARD_ACCURACY,
        "train/loss": mk.POLICY_LOSS,
        "train/grad_norm": mk.POLICY_GRAD_NORM,
        "train/learning_rate": mk.OPTIM_LR,
    },
    OPENRLHF: {
        # openrlhf/models/loss.py (PolicyLoss: vllm_kl = masked_mean(rollout_log_probs -
        # old_log_probs)) stored by openrlhf/trainer/ray/ppo_actor.py as info["vllm_kl"];
        # ppo_actor.py also stores "ppo_clip_ratio", "kl" (the KL loss to the initial
        # policy), "policy_loss", "entropy_loss", "actor_grad_norm", "actor_lr"; rewards
        # and lengths from openrlhf/trainer/ppo_utils/experience_maker.py ("reward",
        # "response_length"). openrlhf/utils/logging_utils.py writes them to TensorBoard
        # as f"train/{k}" (add_scalar) and to W&B with the same prefix.
        "train/vllm_kl": mk.MISMATCH_KL_K1,
        "train/ppo_clip_ratio": mk.POLICY_CLIP_FRAC,
        "train/kl": mk.POLICY_KL_REF,
        "train/policy_loss": mk.POLICY_LOSS,
        "train/entropy_loss": mk.POLICY_ENTROPY,
        "train/actor_grad_norm": mk.POLICY_GRAD_NORM,
        "train/actor_lr": mk.OPTIM_LR,
        "train/reward": mk.REWARD_MEAN,
        "train/response_length": mk.RESPONSE_LENGTH_MEAN,
        # openrlhf/trainer/ppo_trainer.py (status["timing/generation"], ["timing/step_total"])
        "train/timing/step_total": mk.TIME_STEP_S,
        "train/timing/generation": mk.TIME_ROLLOUT_S,
    },
}

FRAMEWORKS: tuple[str, ...] = tuple(FRAMEWORK_MAPS)

# A name that only one framework logs tells which framework a run comes from
# when the client did not say (tag ``lab.framework``).
_OWNERS: dict[str, set[str]] = {}
for _framework, _table in FRAMEWORK_MAPS.items():
    for _name in _table:
        _OWNERS.setdefault(_name, set()).add(_framework)

# The union of the tables where every framework that logs a name means the same lab key,
# used for a run whose framework is not known (yet); namespaced names only: a bare
# "loss" or "reward" says nothing about what was trained, so it is mapped only once
# the framework is known.
UNAMBIGUOUS: dict[str, str] = {
    name: next(iter(targets))
    for name in _OWNERS
    if "/" in name and len(targets := {FRAMEWORK_MAPS[f][name] for f in _OWNERS[name]}) == 1
}

# Steps a framework logs on another axis than its training steps, moved onto it in the
# lab's step rows (the points keep their own step in MLflow's history):
# TRL times a step's phases (trl/extras/profiling.py: "profiling/Time taken: ...") at
# the Trainer's global step while that step is being computed, one before the step
# its metrics land on: they are charted at the step they timed.
STEP_SHIFT: dict[str, tuple[tuple[str, int], ...]] = {TRL: (("profiling/", 1),)}


def step_shift(framework: str, name: str) -> int:
    """How many steps later than logged a point of ``name`` is charted (STEP_SHIFT)."""
    for prefix, shift in STEP_SHIFT.get(framework, ()):
        if name.startswith(prefix):
            return shift
    return 0


# slime's two step axes (slime/observability/logging_utils.py log(..., step_key)):
# "train/*" at train/step = rollout_id x steps per rollout + step
# (slime/backends/megatron_utils/model.py), everything else at rollout/step = the
# rollout id (slime/observability/metric_utils.py compute_rollout_step; the train
# axis again under --wandb-always-use-train-step). tracking/tensorboard.py aligns them
# and keeps [k, rollout axis in train steps] on the run (Run.source).
SLIME_TRAIN_PREFIX = "train/"
STEPS_PER_ROLLOUT = "steps_per_rollout"


def lab_step_function(framework: str, source: dict) -> Callable[[str, int], int]:
    """The lab step a point (name, step as logged) is charted at, for a run of this
    framework and ``Run.source``: slime's axes folded onto its rollouts, TRL's timings
    moved to the step they timed, every other point at its own step."""
    aligned = source.get(STEPS_PER_ROLLOUT) if framework == SLIME else None
    if aligned:
        k, both = int(aligned[0]), bool(aligned[1])

        def slime_step(name: str, step: int) -> int:
            return step // k if (both or name.startswith(SLIME_TRAIN_PREFIX)) else step

        return slime_step
    shifts = STEP_SHIFT.get(framework, ())
    if not shifts:
        return lambda name, step: step
    return lambda name, step: step + step_shift(framework, name)


EXPERT_LOAD_SCALAR = re.compile(r"^experts/load/L(\d{1,4})/e(\d{1,5})$")


def detect_framework(names: Iterable[str]) -> str:
    """The framework whose own namespaced names (logged by no other) ``names`` contains
    most; '' when none (bare names like "loss" never decide)."""
    votes: dict[str, int] = {}
    for name in names:
        owners = _OWNERS.get(name) if "/" in name else None
        if owners is not None and len(owners) == 1:
            (owner,) = owners
            votes[owner] = votes.get(owner, 0) + 1
    if not votes:
        return ""
    return max(sorted(votes), key=lambda f: votes[f])


def lab_key(name: str, framework: str = "") -> str:
    """The key ``name`` is stored under: its lab key when the framework's table (or,
    framework unknown, every table that lists it) maps it, else ``name`` itself."""
    table = FRAMEWORK_MAPS.get(framework)
    if table is not None:
        return table.get(name, name)
    return UNAMBIGUOUS.get(name, name)


def vector_slot(key: str) -> tuple[str, int] | None:
    """``("experts/load/L{l}", e)`` for an ``experts/load/L{l}/e{e}`` scalar (one expert's
    share of a layer's load), else None: the store keeps each layer's loads as the lab's
    vector, filled slot by slot as the scalars arrive (a step's scalars may span batches)."""
    match = EXPERT_LOAD_SCALAR.match(key)
    if match is None:
        return None
    return mk.experts_load(int(match.group(1))), int(match.group(2))
