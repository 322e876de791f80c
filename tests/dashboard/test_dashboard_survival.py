import pytest

from dashboard.charts.survival import (
    RunOutcome,
    VariantCollapse,
    censor_marks,
    collapse_summary,
    kaplan_meier,
    summarize_outcomes,
)

# Five seeds: collapses at 100, 300, 400; censored (never collapsed) at 200 and 300.
EVENTS = [(100, True), (200, False), (300, True), (300, False), (400, True)]


def test_kaplan_meier_by_hand():
    steps, survival = kaplan_meier(EVENTS)
    # t=100: 5 at risk, 1 collapses -> 4/5
    # t=200: a censoring, no drop; 3 remain at risk
    # t=300: 3 at risk (the run censored at 300 still counts), 1 collapses -> 4/5 * 2/3
    # t=400: 1 at risk, it collapses -> 0
    assert steps == [0, 100, 200, 300, 400]
    assert survival == pytest.approx([1.0, 0.8, 0.8, 0.8 * 2 / 3, 0.0])


def test_kaplan_meier_is_not_the_naive_share():
    # Naive "share of runs not collapsed by 300" would be 2/5 = 0.4: it counts the
    # run censored at 200 as surviving past 300, which nobody observed.
    _, survival = kaplan_meier(EVENTS)
    assert survival[3] == pytest.approx(8 / 15)


def test_all_censored_stays_at_one_and_all_collapsed_reaches_zero():
    assert kaplan_meier([(500, False), (500, False)]) == ([0, 500], [1.0, 1.0])
    steps, survival = kaplan_meier([(10, True), (20, True)])
    assert steps == [0, 10, 20] and survival == pytest.approx([1.0, 0.5, 0.0])


def test_kaplan_meier_edge_cases():
    assert kaplan_meier([]) == ([], [])
    steps, survival = kaplan_meier([(0, True), (50, False)])
    assert steps == [0, 0, 50] and survival == [1.0, 0.5, 0.5]  # a drop at step 0


def test_censor_marks_sit_on_the_curve():
    assert censor_marks(EVENTS) == ([200, 300], pytest.approx([0.8, 0.8 * 2 / 3]))


def test_collapse_summary_all_collapsed_is_a_plain_mean():
    summary = summarize_outcomes("dense", [(10, True), (21, True)])
    assert summary == VariantCollapse(2, 2, 15.5, False, variant="dense")
    assert summary.label == "16"  # rounded half up
    assert summary.count_label == "2/2 collapsed"


def test_collapse_summary_with_a_censored_seed_is_a_lower_bound():
    runs = [
        RunOutcome("moe-grpo", 100, True, seed=0),
        RunOutcome("moe-grpo", 1001, False, seed=1),
        RunOutcome("moe-grpo-r3", 2000, False, seed=0),
        RunOutcome("moe-grpo-r3", 2000, False, seed=1),
    ]
    out = collapse_summary(runs)
    assert list(out) == ["moe-grpo", "moe-grpo-r3"]
    grpo = out["moe-grpo"]
    assert grpo.mean_step == 550.5 and grpo.lower_bound
    assert grpo.label == ">= 550"  # rounded down so that it stays a lower bound
    assert (grpo.collapsed, grpo.runs) == (1, 2)
    r3 = out["moe-grpo-r3"]
    assert r3.label == ">= 2000" and r3.count_label == "0/2 collapsed"


def test_collapse_summary_of_no_runs():
    assert summarize_outcomes("x", []).label == "-"


def test_outcome_from_summary():
    collapsed = RunOutcome.from_summary(
        "v", {"collapsed": True, "collapse_step": 812, "steps": 2000}, seed=3
    )
    assert collapsed == RunOutcome("v", 812, True, seed=3)
    censored = RunOutcome.from_summary("v", {"collapsed": False, "steps": 2000})
    assert censored.event == (2000, False)
    assert (
        RunOutcome.from_summary("v", {"collapsed": False, "steps": 2000}, last_step=1998).step
        == 1999  # steps 0..1998 stored: 1999 steps run
    )
    with pytest.raises(ValueError, match="collapse_step"):
        RunOutcome.from_summary("v", {"collapsed": True})
    with pytest.raises(ValueError, match="step count"):
        RunOutcome.from_summary("v", {"collapsed": False})
