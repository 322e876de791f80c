"""The run page tells the warm start (before RL step 0) and the cache hit."""

from __future__ import annotations

from lab.runs.models import Run, RunStatus
from trainer import metric_keys as K


def test_run_page_and_status_show_the_warm_start_with_its_eta(alice, make_run):
    run = make_run(status=RunStatus.RUNNING)
    Run.objects.filter(pk=run.pk).update(
        phase="warmstart",
        phase_progress={K.WARMSTART_STEP: 150, K.WARMSTART_MAX_STEPS: 3000,
                        K.WARMSTART_ACCURACY: 0.08, K.WARMSTART_TARGET: 0.2,
                        K.WARMSTART_ETA_S: 42.0, K.WARMSTART_CACHED: False},
    )  # fmt: skip
    expected = (
        "warm start (supervised base policy before RL step 0): SFT step 150/3000 · "
        "held-out accuracy 8% (target 20%) · ETA ~42 s"
    )
    assert expected in alice.get(f"/runs/{run.pk}/").content.decode()
    status = alice.get(f"/runs/{run.pk}/status").json()
    assert status["phase"] == "warmstart" and status["phase_text"] == expected


def test_the_progress_bar_follows_the_warm_start_then_the_rl_steps(alice, make_run):
    """Before RL step 0 the bar would sit at 0 through the whole warm start."""
    run = make_run(status=RunStatus.RUNNING)
    Run.objects.filter(pk=run.pk).update(
        phase="warmstart", current_step=0,
        phase_progress={K.WARMSTART_STEP: 150, K.WARMSTART_MAX_STEPS: 3000},
    )  # fmt: skip
    assert '<progress max="3000" value="150"' in alice.get(f"/runs/{run.pk}/").content.decode()
    assert alice.get(f"/runs/{run.pk}/status").json()["bar"] == {"value": 150, "max": 3000}
    Run.objects.filter(pk=run.pk).update(phase="training", current_step=7)
    total = Run.objects.get(pk=run.pk).total_steps
    assert alice.get(f"/runs/{run.pk}/status").json()["bar"] == {"value": 7, "max": total}


def test_run_page_says_when_the_cached_base_policy_was_used(alice, make_run):
    run = make_run(status=RunStatus.SUCCEEDED)
    Run.objects.filter(pk=run.pk).update(
        phase="training", phase_progress={K.WARMSTART_ACCURACY: 0.27, K.WARMSTART_CACHED: True}
    )
    page = alice.get(f"/runs/{run.pk}/").content.decode()
    assert "using cached base policy (held-out accuracy 27%)" in page


def test_status_is_shown_once_on_the_run_page(alice, make_run):
    run = make_run(status=RunStatus.RUNNING)
    page = alice.get(f"/runs/{run.pk}/").content.decode()
    assert page.count('data-field="status"') == 1
    assert page.count('data-field="progress"') == 1
