"""The RL loop end to end: files, resume equivalence, SIGTERM, determinism, bad config."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainer import metric_keys as K
from trainer.config import apply_overrides
from trainer.config.presets import preset_dict
from trainer.run.runner import train
from trainer.run_folder.files import read_metrics
from trainer.validation import validate_config

ROOT = Path(__file__).resolve().parents[2]

# Small enough for a 2-core machine: 2 prompts x 4 samples, short warm start.
FAST = [
    "run.steps=4",
    "run.eval_every=2",
    "run.checkpoint_every=2",
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "algorithm.minibatches=2",
    "warm_start.max_steps=40",
    "warm_start.eval_every=20",
    "warm_start.eval_size=16",
    "task.eval_size=16",
    "run.threads=1",
]


def fast_config(preset: str = "moe-grpo", extra: list[str] | None = None):
    return validate_config(apply_overrides(preset_dict(preset), FAST + (extra or [])))


def _comparable(rows: list[dict]) -> list[dict]:
    """Drop wall-clock keys: everything else must match exactly."""
    return [
        {k: v for k, v in r.items() if not k.startswith(("time/", "throughput/"))} for r in rows
    ]


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("MOE_LAB_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def test_run_writes_metrics_and_summary(finished_run):
    run_dir, summary = finished_run
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    for key in (
        K.REWARD_MEAN, K.REWARD_ACCURACY, K.MISMATCH_KL_K1, K.MISMATCH_KL_K3,
        K.MISMATCH_EXTREME_TOKEN_FRAC, K.MISMATCH_ROUTING_INCONSISTENCY, K.MISMATCH_SDI,
        K.EXPERTS_UTILIZATION, K.EXPERTS_MAX_VIOLATION, K.EXPERTS_ROUTER_ENTROPY,
        K.POLICY_LOSS, K.POLICY_GRAD_NORM, K.OPTIM_LR, K.TIME_STEP_S, K.experts_load(0),
    ):  # fmt: skip
        assert key in rows[0], key
    assert len(rows[0][K.experts_load(1)]) == 8
    assert abs(sum(rows[0][K.experts_load(1)]) - 1.0) < 1e-5
    on_disk = json.loads((run_dir / "summary.json").read_text())
    assert on_disk == summary
    assert summary["status"] == "succeeded" and summary["steps"] == 4
    assert summary["collapsed"] is False and summary["collapse_step"] is None
    assert (run_dir / "checkpoints" / "last.pt").exists()


def test_same_seed_same_metrics(tmp_path, finished_run):
    """The same config again: the same metrics, bit for bit (the session's run is the first)."""
    first_dir, first = finished_run
    again = train(fast_config(), tmp_path / "again")
    assert first["final_accuracy"] == again["final_accuracy"]
    assert _comparable(read_metrics(first_dir)) == _comparable(read_metrics(tmp_path / "again"))


# Every stabilizer with state on at once (R3 rather than R2: they are exclusive), with
# the warm-up and the controllers acting across the resume point at step 2.
ALL_STABILIZERS = [
    "stabilizers.replay.mode=r3",
    "stabilizers.replay.warmup_steps=3",
    "stabilizers.replay.compression=rle",
    "stabilizers.balance.aux_loss_coef=0.01",
    "stabilizers.balance.aux_loss_scope=sequence",
    "stabilizers.balance.z_loss_coef=0.001",
    "stabilizers.balance.aux_free_bias=true",
    "stabilizers.balance.router_kl_coef=0.1",
    "stabilizers.balance.router_kl_buffer_steps=2",
    "stabilizers.surgery.enabled=true",
    "stabilizers.router_temperature.enabled=true",
    "stabilizers.router_temperature.interval=1",
    "stabilizers.noisy_gating.enabled=true",
    "optim.per_expert_grad_clip=1.0",
    "optim.router_lr_scale=0.5",
    "stabilizers.is_correction.kind=tis",
    "algorithm.advantage.ema_decay=0.99",
    "algorithm.advantage.expert_zscore=true",
]


# The families' features on the builtin model: DeepSeek-V3's latent attention, sigmoid
# group-limited routing, routed scaling, shared expert and dense first block, with the
# aux-free bias trained and R3; GPT-OSS's sinks, biases, clamp and a sliding block.
DEEPSEEK_SHAPED = [
    "model.mla.enabled=true", "model.mla.q_lora_rank=32", "model.router.score=sigmoid",
    "model.router.n_groups=4", "model.router.topk_groups=2", "model.router.scaling=2.5",
    "model.shared_expert_hidden=64", "model.dense_layers=[0]", "model.n_layers=3",
    "stabilizers.replay.mode=r3", "stabilizers.balance.aux_free_bias=true",
]  # fmt: skip
GPT_OSS_SHAPED = [
    "model.attention_sinks=true", "model.attention_bias=qkvo", "model.router.bias=true",
    "model.expert_ffn.bias=true", "model.expert_ffn.activation=clamped_swiglu",
    "model.sliding_window=8", "model.sliding_layers=[0]", "stabilizers.replay.mode=r3",
]  # fmt: skip


@pytest.mark.parametrize(
    "preset, extra",
    [
        ("moe-grpo", []),
        ("moe-ppo", []),
        ("moe-grpo", ALL_STABILIZERS),
        pytest.param("moe-grpo", DEEPSEEK_SHAPED, marks=pytest.mark.slow),
        pytest.param("moe-grpo", GPT_OSS_SHAPED, marks=pytest.mark.slow),
    ],
    ids=["moe-grpo", "moe-ppo", "all-stabilizers", "deepseek-shaped", "gpt-oss-shaped"],
)
def test_resume_gives_the_same_stream_as_straight(tmp_path, preset, extra, request):
    cfg = fast_config(preset, extra)
    straight_dir = tmp_path / "straight"
    if (preset, extra) == ("moe-grpo", []):  # that run is the session's finished run
        straight_dir = request.getfixturevalue("finished_run")[0]
    else:
        train(cfg, straight_dir)
    first = train(cfg, tmp_path / "resumed", stop_after=2)
    assert first["status"] == "stopped" and first["steps"] == 2
    second = train(cfg, tmp_path / "resumed", resume=True)
    assert second["steps"] == 4
    straight = _comparable(read_metrics(straight_dir))
    resumed = _comparable(read_metrics(tmp_path / "resumed"))
    assert [r["step"] for r in resumed] == [0, 1, 2, 3]
    assert resumed == straight
    if extra is ALL_STABILIZERS:  # the stabilizers really ran
        for key in (K.R3_REPLAYED_FRAC, K.LB_AUX_LOSS, K.LB_Z_LOSS, K.LB_ROUTER_KL,
                    K.GRADS_COS_POLICY_AUX, K.TIS_CLIP_FRAC):  # fmt: skip
            assert key in straight[-1], key
        assert straight[-1][K.ROUTER_TEMPERATURE] != 1.0
    if extra is DEEPSEEK_SHAPED:  # the trained bias logged, dense block 0 logs no load
        assert straight[-1][K.ROUTER_SELECTION_BIAS_ABS_MEAN] > 0
        assert straight[-1][K.ROUTER_SELECTION_BIAS_SPREAD] > 0
        assert K.experts_load(0) not in straight[-1]
        assert {K.experts_load(1), K.experts_load(2)} <= set(straight[-1])


def _cli(*args: str, env=None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainer", *args],
        cwd=ROOT, capture_output=True, text=True, env=env, **kw,
    )  # fmt: skip


def test_cli_bad_config_names_field_and_writes_nothing(tmp_path):
    out = tmp_path / "run"
    result = _cli("run", "--preset", "moe-grpo", "--set", "model.top_k=99",
                  "--set", "algorithm.nmae=\"x\"", "--out", str(out))  # fmt: skip
    assert result.returncode == 2
    assert "model.top_k" in result.stderr or "algorithm.nmae" in result.stderr
    assert not out.exists()
    result = _cli("run", "--preset", "no-such-preset", "--out", str(out))
    assert result.returncode == 2 and "unknown preset" in result.stderr
    assert not out.exists()


def test_cli_prints_deprecated_paths_and_still_accepts_them():
    result = _cli("config", "--preset", "moe-grpo", "--set", "stabilizers.routing_replay=r3")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["stabilizers"]["replay"]["mode"] == "r3"
    assert (
        "deprecated: stabilizers.routing_replay is deprecated; use stabilizers.replay.mode"
        in result.stderr
    )


def test_cli_exits_quietly_on_a_closed_pipe():
    """`python -m trainer presets | head -1`: no BrokenPipeError traceback."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer", "presets"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    # The reader goes away before the CLI (still importing) writes anything, as
    # `head -1` does once it has its line; every write then meets a closed pipe.
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0
    assert "BrokenPipeError" not in stderr and "Traceback" not in stderr, stderr


@pytest.mark.slow
def test_sigterm_finishes_step_checkpoints_and_cancels(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    overrides = [a for item in FAST for a in ("--set", item)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer", "run", "--preset", "moe-grpo", *overrides,
         "--set", "run.steps=500", "--out", str(out)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.time() + 120
    while time.time() < deadline:
        if len(read_metrics(out)) >= 2:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    assert proc.returncode == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "cancelled"
    rows = read_metrics(out)
    assert summary["steps"] == len(rows) and 2 <= len(rows) < 500
    assert (out / "checkpoints" / "last.pt").exists()
