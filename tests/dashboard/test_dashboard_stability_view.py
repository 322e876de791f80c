"""The stability review page computed from constructed runs, censoring included."""

from __future__ import annotations

import csv
import io
import re

import pytest

from lab.runs.models import RunStatus
from tests.dashboard.conftest import payload_traces, records


def _run(make_run, variant, seed, *, kl, collapse=None, steps=100, accuracy=0.5):
    summary = {"collapsed": collapse is not None, "final_accuracy": accuracy, "steps": steps}
    if collapse is not None:
        summary |= {"collapse_step": collapse, "collapse_reason": "accuracy fell"}
    return make_run(
        variant=variant,
        seed=seed,
        records=records(
            steps,
            mismatch__kl_k3=lambda s: kl,
            mismatch__routing_inconsistency=lambda s: 0.1,
            mismatch__extreme_token_frac=lambda s: 0.05,
        ),
        summary=summary,
    )


@pytest.fixture
def study(make_run):
    runs = [
        _run(make_run, "none", 0, kl=2e-3, collapse=40, accuracy=0.5),
        _run(make_run, "none", 1, kl=2e-3, collapse=60, accuracy=0.4),
        _run(make_run, "none", 2, kl=2e-3, accuracy=0.6),  # never collapsed: censored at 99
        _run(make_run, "r3", 0, kl=1e-3, accuracy=0.7),
        _run(make_run, "r3", 1, kl=3e-3, accuracy=0.7),
        _run(make_run, "tis", 0, kl=5e-3, collapse=20, accuracy=0.1),
        _run(make_run, "tis", 1, kl=5e-3, collapse=31, accuracy=0.1),
        make_run(variant="late", seed=0, status=RunStatus.QUEUED),  # nothing to say yet
    ]
    return ",".join(str(r.pk) for r in runs), runs


def _table(html: str) -> list[list[str]]:
    body = html.split('class="stability"')[1].split("</table>")[0].split("<tbody>")[1]
    return [re.findall(r"<td>(.*?)</td>", row) for row in body.split("</tr>") if "<td>" in row]


def test_stability_table_per_variant_with_censoring(alice, study):
    ids, runs = study
    response = alice.get("/stability/", {"runs": ids})
    assert response.status_code == 200
    html = response.content.decode()
    rows = {cells[0]: cells for cells in _table(html)}
    # variant, seeds, KL x1e-3, routing %, extreme %, collapse step, collapsed, final accuracy %
    assert rows["none"] == [
        "none",
        "3",
        "2.00",
        "10.00%",
        "5.00%",
        "&gt;= 66",
        "2/3",
        "50.0 ± 10.0%",
    ]
    assert rows["r3"] == ["r3", "2", "2.00 ± 1.41", "10.00%", "5.00%", "&gt;= 100", "0/2", "70.0%"]
    assert rows["tis"] == ["tis", "2", "5.00", "10.00%", "5.00%", "26", "2/2", "10.0%"]
    assert "late" not in rows
    assert f"#{runs[-1].pk}" in html.split("Not in the table")[1]
    assert "&gt;= 100 (censored)" in html  # per-run table
    assert "/stability/chart/survival?runs=" in html and "/stability/chart/collapse?runs=" in html


def test_stability_table_downloads(alice, study):
    ids, _ = study
    data = alice.get("/stability/table", {"runs": ids}).json()["rows"]
    none = next(r for r in data if r["variant"] == "none")
    assert none["collapse_step"] == ">= 66"
    assert none["collapse_step_is_lower_bound"] is True
    assert none["collapse_step_mean"] == pytest.approx((40 + 60 + 100) / 3)
    assert none["kl_k3_x1e3"] == pytest.approx(2.0)
    response = alice.get("/stability/table", {"runs": ids, "format": "csv"})
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert [r["variant"] for r in rows] == ["none", "r3", "tis"]
    assert rows[2]["collapse_step"] == "26"


def test_stability_of_a_whole_experiment(alice, study, experiment):
    ids, _ = study
    by_experiment = alice.get("/stability/", {"experiment": experiment.pk}).content.decode()
    by_runs = alice.get("/stability/", {"runs": ids}).content.decode()
    assert _table(by_experiment) == _table(by_runs)


def test_survival_curve_is_kaplan_meier(alice, study):
    ids, _ = study
    traces = payload_traces(alice.get("/stability/chart/survival", {"runs": ids}))
    none = next(t for t in traces if t["meta"] == {"variant": "none", "role": "survival"})
    assert none["x"].tolist() == [0, 40, 60, 100]
    assert none["y"] == pytest.approx([1, 2 / 3, 1 / 3, 1 / 3])
    assert none["name"] == "none (2/3 collapsed)"
    r3 = next(t for t in traces if t["meta"] == {"variant": "r3", "role": "survival"})
    assert r3["y"] == pytest.approx([1, 1])
    censored = next(t for t in traces if t["meta"] == {"variant": "none", "role": "censored"})
    assert censored["x"].tolist() == [100]


def test_collapse_strip_labels_censored_seeds(alice, study):
    ids, _ = study
    response = alice.get("/stability/chart/collapse", {"runs": ids})
    data = response.json()["figure"]["data"]
    censored = next(
        t for t in data if t["meta"]["variant"] == "none" and t["meta"]["role"] == "censored"
    )
    assert censored["text"] == [">= 100"]
    mean = next(t for t in data if t["meta"]["variant"] == "tis" and t["meta"]["role"] == "mean")
    assert mean["text"] == ["26"]
    rows = list(
        csv.DictReader(
            io.StringIO(
                alice.get(
                    "/stability/chart/collapse", {"runs": ids, "format": "csv"}
                ).content.decode()
            )
        )
    )
    assert {"trace": "none: censored", "x": "none", "y": "100", "text": ">= 100"} in rows


def test_stability_page_without_runs_offers_experiments(alice, experiment):
    html = alice.get("/stability/").content.decode()
    assert f"/stability/?experiment={experiment.pk}" in html


def test_repeated_runs_parameter_reaches_every_consumer(alice, study):
    """``?runs=4&runs=3&runs=2`` (the runs list's checkboxes) is three runs for the
    table, the charts and the CSV/JSON downloads alike, not just the last one."""
    _, runs = study
    chosen = [runs[0].pk, runs[3].pk, runs[5].pk]  # variants none, r3, tis
    query = "&".join(f"runs={pk}" for pk in chosen)
    html = alice.get(f"/stability/?{query}").content.decode()
    assert {cells[0] for cells in _table(html)} == {"none", "r3", "tis"}
    joined = "%2C".join(map(str, chosen))
    links = re.findall(r'"(/stability/(?:chart|table)[^"]*)"', html)
    assert len(links) >= 4  # two charts, CSV and JSON
    assert all(f"runs={joined}" in link for link in links), links
    table = alice.get(f"/stability/table?{query}&format=csv").content.decode()
    assert {row["variant"] for row in csv.DictReader(io.StringIO(table))} == {"none", "r3", "tis"}
    rows = alice.get(f"/stability/table?{query}").json()["rows"]
    assert len(rows) == 3
    survival = alice.get(f"/stability/chart/survival?{query}").json()
    names = " ".join(t.get("name") or "" for t in survival["figure"]["data"])
    assert all(variant in names for variant in ("none", "r3", "tis")), names


def test_stability_page_shows_log_rank_median_ci_and_the_dose_chart(alice, make_run):
    runs = [
        _run(make_run, "moe-grpo-fp8", 0, kl=5e-3, collapse=40),
        _run(make_run, "moe-grpo-fp8", 1, kl=5e-3, collapse=60),
        _run(make_run, "moe-grpo-fp32", 0, kl=1e-9),
        _run(make_run, "moe-grpo-fp32", 1, kl=1e-9),
    ]
    ids = ",".join(str(r.pk) for r in runs)
    html = alice.get("/stability/", {"runs": ids}).content.decode()
    body = html.split('class="survival-stats"')[1].split("</table>")[0]
    rows = [re.findall(r"<td>(.*?)</td>", row) for row in body.split("</tr>") if "<td>" in row]
    # no moe-grpo variant: the dose axis' fp32 arm (no precision gap) is the
    # reference, whatever the order the runs were picked in
    assert "log-rank p vs moe-grpo-fp32" in html
    assert rows[1][:4] == ["moe-grpo-fp32", "0/2", "not reached (&gt;= 100)", "-"]
    # fp8 vs fp32 (both censored at 99): t=40 n=2+2, E=.5, V=.25; t=60 n=1+2, E=1/3,
    # V=2/9; O-E = 2 - 5/6 = 7/6: chi2 = (7/6)^2 / (17/36) = 2.882, p = erfc(1.2004)
    assert rows[0][:4] == ["moe-grpo-fp8", "2/2", "40 [40, 60]", "0.0896"]
    assert "/stability/chart/dose?runs=" in html
    chart = alice.get("/stability/chart/dose", {"runs": ids})
    assert chart.status_code == 200
    figure = chart.json()["figure"]
    (trace,) = figure["data"]  # one arm: at the levels' ticks, named by ticktext
    assert trace["x"] == [0.0, 1.0] and figure["layout"]["xaxis"]["ticktext"] == ["fp32", "fp8"]
    assert trace["text"] == ["fp32: 0/2", "fp8: 2/2"]


def _survival(html: str) -> dict[str, list[str]]:
    body = html.split('class="survival-stats"')[1].split("</table>")[0].split("<tbody>")[1]
    rows = [re.findall(r"<td>(.*?)</td>", row) for row in body.split("</tr>") if "<td>" in row]
    return {cells[0]: cells for cells in rows}


def test_log_rank_baseline_does_not_depend_on_selection_order(alice, make_run):
    """ "Review selected" lists runs newest first; the baseline is still the rule's
    (the fp32 arm of a dose axis), as on the experiment's review."""
    runs = [
        _run(make_run, "arm-fp32", 0, kl=1e-3),
        _run(make_run, "arm-fp32", 1, kl=1e-3, collapse=80),
        _run(make_run, "arm-fp8", 0, kl=5e-3, collapse=20),
        _run(make_run, "arm-fp8", 1, kl=5e-3, collapse=30),
    ]
    newest_first = ",".join(str(r.pk) for r in reversed(runs))
    oldest_first = ",".join(str(r.pk) for r in runs)
    for ids in (newest_first, oldest_first):
        html = alice.get("/stability/", {"runs": ids}).content.decode()
        assert "log-rank p vs arm-fp32" in html
        assert _survival(html)["arm-fp32"][3] == "-"  # the baseline is not tested against itself


def test_the_user_chooses_the_log_rank_baseline(alice, study):
    ids, _ = study
    html = alice.get("/stability/", {"runs": ids, "reference": "r3"}).content.decode()
    assert "log-rank p vs r3" in html and '<option value="r3" selected>' in html
    survival = _survival(html)
    assert survival["r3"][3] == "-" and survival["none"][3] != "-"
    # the choice travels with the downloads; an unknown one falls back to the rule
    assert "reference=r3" in html.split("reference-form")[1].split("</form>")[0]
    assert (
        "log-rank p vs none"
        in alice.get("/stability/", {"runs": ids, "reference": "x"}).content.decode()
    )


def test_time_to_collapse_table_downloads_as_csv(alice, study):
    ids, _ = study
    html = alice.get("/stability/", {"runs": ids}).content.decode()
    link = re.search(r'href="([^"]*table=survival[^"]*)"', html).group(1).replace("&amp;", "&")
    response = alice.get(link)
    assert response.status_code == 200
    assert 'filename="time-to-collapse.csv"' in response["Content-Disposition"]
    table = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert [row["variant"] for row in table] == list(_survival(html))
    assert {"collapsed", "median", "logrank_p", "kl_ci"} <= set(table[0])
    assert alice.get(link.replace("table=survival", "table=other")).status_code == 400


def test_a_variant_keeps_its_colour_from_page_to_page(alice, make_run, experiment):
    """The experiment page's swatches, its band charts and the stability review of
    the same runs picked in another order give each variant one colour."""
    runs = [_run(make_run, v, seed, kl=1e-3, collapse=40 + seed)
            for v in ("zeta", "alpha", "mid") for seed in (0, 1)]  # fmt: skip
    page = alice.get(f"/experiments/{experiment.pk}/").content.decode()
    swatches = dict(
        (name, color)
        for color, name in re.findall(
            r'class="swatch" style="background: ([^"]+)"></span> (\w+)', page
        )
    )
    assert set(swatches) == {"zeta", "alpha", "mid"}
    band = alice.get(f"/experiments/{experiment.pk}/chart", {"key": "mismatch/kl_k3"})
    band_colors = {t["meta"]["variant"]: t["line"]["color"] for t in payload_traces(band)
                   if t.get("meta", {}).get("role") == "mean"}  # fmt: skip
    ids = ",".join(str(r.pk) for r in reversed(runs))
    survival = alice.get("/stability/chart/survival", {"runs": ids})
    survival_colors = {t["meta"]["variant"]: t["line"]["color"] for t in payload_traces(survival)
                       if t.get("meta", {}).get("role") == "survival"}  # fmt: skip
    assert band_colors == swatches and survival_colors == swatches


def test_the_review_shows_cox_effects_against_the_routing_gap(alice, make_run):
    """Runs spanning a routing-only dose get the causal panel: hazard ratios per 10
    points of gap (Cox, stratified by base), Holm-adjusted p, the power statement
    and the gap scatter; the rest of the review is unchanged."""
    made = []
    # hazard rising with the gap: more and earlier collapses at larger gaps
    plan = {0.0: [None, None, None, None], 0.15: [None, 80, None, 90], 0.3: [30, 45, 60, None]}
    for gap, collapses in plan.items():
        for seed, collapse in enumerate(collapses):
            summary = {"collapsed": collapse is not None, "steps": 100, "final_accuracy": 0.4}
            if collapse is not None:
                summary["collapse_step"] = collapse
            made.append(
                make_run(
                    variant=f"moe-s{gap}",
                    seed=seed,
                    records=records(100, mismatch__routing_inconsistency=lambda s, g=gap: g),
                    summary=summary,
                    overrides={"warm_start.seed": seed % 2},
                )
            )
    ids = ",".join(str(r.pk) for r in made)
    html = alice.get("/stability/", {"runs": ids}).content.decode()
    assert "Collapse against the routing gap" in html
    panel = html.split('class="causal-effects"')[1].split("</table>")[0]
    rows = dict(re.findall(r"<tr><td>(.*?)</td><td>(.*?)</td>", panel))
    hr = float(rows["MoE hazard per 10 points of routing gap"].split()[0])
    assert hr > 1
    assert "collapses among 12 MoE runs" in html and "Schoenfeld" in html
    assert "/stability/chart/gap?runs=" in html
    chart = alice.get("/stability/chart/gap", {"runs": ids})
    assert chart.status_code == 200
    xs = sorted(
        x for trace in payload_traces(chart) for x in trace["x"] if x is not None and x == x
    )
    assert xs[0] == pytest.approx(0.0) and xs[-1] == pytest.approx(30.0)


def test_no_causal_panel_without_a_gap_spread(alice, study):
    ids, _ = study
    html = alice.get("/stability/", {"runs": ids}).content.decode()
    assert "Collapse against the routing gap" not in html
    assert alice.get("/stability/chart/gap", {"runs": ids}).status_code == 400
