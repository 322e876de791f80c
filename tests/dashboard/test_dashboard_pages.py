"""Pages: login required, and what each renders on the server."""

from __future__ import annotations

import re

import pytest

from lab.experiments.services import create_experiment
from lab.runs import sweeps
from lab.runs.metrics.ingest import ingest_metrics
from lab.runs.models import Run, RunStatus
from tests.dashboard.conftest import records

PAGES = [
    "/runs/",
    "/runs/{run}/",
    "/experiments/{experiment}/",
    "/compare/?runs={run}",
    "/comparisons/",
    "/stability/?runs={run}",
]
ENDPOINTS = [
    "/runs/{run}/chart?key=reward/accuracy",
    "/runs/{run}/heatmap?layer=0",
    "/runs/{run}/status",
    "/experiments/{experiment}/chart?key=reward/accuracy",
    "/compare/chart?runs={run}&key=reward/accuracy",
    "/stability/chart/survival?runs={run}",
    "/stability/table?runs={run}",
]
POSTS = [
    "/runs/{run}/",
    "/runs/{run}/verdict",
    "/runs/{run}/pin",
    "/comparisons/save",
]


@pytest.mark.parametrize("url", PAGES)
def test_pages_redirect_anonymous_users_to_login(client, make_run, url):
    run = make_run()
    target = url.format(run=run.pk, experiment=run.experiment_id)
    response = client.get(target)
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=")


@pytest.mark.parametrize("url", ENDPOINTS)
def test_chart_endpoints_refuse_anonymous_users(client, make_run, url):
    run = make_run(records=records(3, reward__accuracy=lambda s: 0.5))
    response = client.get(url.format(run=run.pk, experiment=run.experiment_id))
    assert response.status_code == 401
    assert "log in" in response.json()["detail"]


@pytest.mark.parametrize("url", POSTS)
def test_review_actions_refuse_anonymous_users(client, make_run, url):
    run = make_run()
    response = client.post(url.format(run=run.pk), {"body": "x", "label": "stable", "name": "x"})
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_site_root_redirects_to_the_experiments(alice, db):
    assert alice.get("/")["Location"] == "/experiments/"


def test_login_page_renders(client, db):
    response = client.get("/accounts/login/")
    assert response.status_code == 200
    assert b'name="username"' in response.content


def _listed(response) -> list[int]:
    return [int(i) for i in re.findall(r'data-run-id="(\d+)"', response.content.decode())]


def test_runs_list_filters_and_sorts(alice, make_run, user, other_user):
    tagged = create_experiment(owner=user, name="tagged", preset="moe-grpo", tags=["study"])
    a = make_run(seed=0, status=RunStatus.RUNNING)
    b = make_run(seed=1, owner=other_user, queue="gpu-a100")
    c = make_run(seed=2, experiment_=tagged)
    assert _listed(alice.get("/runs/")) == [c.pk, b.pk, a.pk]  # newest first
    assert _listed(alice.get("/runs/", {"sort": "oldest"})) == [a.pk, b.pk, c.pk]
    assert _listed(alice.get("/runs/", {"status": "running"})) == [a.pk]
    assert _listed(alice.get("/runs/", {"owner": "bob"})) == [b.pk]
    assert _listed(alice.get("/runs/", {"queue": "gpu-a100"})) == [b.pk]
    assert _listed(alice.get("/runs/", {"experiment": tagged.pk})) == [c.pk]
    assert _listed(alice.get("/runs/", {"tag": "study"})) == [c.pk]
    page = alice.get("/runs/").content.decode()
    assert 'action="/compare/"' in page and 'formaction="/stability/"' in page
    assert f'name="runs" value="{a.pk}"' in page


def test_runs_list_rejects_a_malformed_filter(alice, db):
    assert alice.get("/runs/", {"experiment": "abc"}).status_code == 400


def test_run_page_shows_everything_server_side(alice, make_run, settings, tmp_path):
    settings.RUNS_DIR = tmp_path
    run = make_run(
        records=records(20, reward__accuracy=lambda s: 0.5),
        status=RunStatus.RUNNING,
        summary={
            "collapsed": True,
            "collapse_step": 12,
            "collapse_reason": "reward/accuracy fell below 50% of best",
        },
    )
    run_dir = tmp_path / "run-x"
    run_dir.mkdir()
    (run_dir / "trainer.log").write_text("=== attempt 1\nstep 19 <ok>\n")
    Run.objects.filter(pk=run.pk).update(run_dir=str(run_dir))
    page = alice.get(f"/runs/{run.pk}/").content.decode()
    assert "Collapsed at step 12: reward/accuracy fell below 50% of best" in page
    assert "step 19 &lt;ok&gt;" in page  # log tail, escaped
    assert "&quot;n_experts&quot;: 8" in page  # config
    assert f'data-run-status="/runs/{run.pk}/status"' in page
    assert 'data-running="true"' in page
    for key in [
        "reward/accuracy",
        "mismatch/kl_k1",
        "mismatch/kl_k3",
        "mismatch/extreme_token_frac",
        "mismatch/routing_inconsistency",
        "experts/max_violation",
        "experts/router_entropy",
        "router/temperature",
        "policy/grad_norm",
        "grads/cos_policy_aux",
        "grads/surgery_frac",
        "policy/clip_frac",
        "tis/clip_frac",
    ]:
        assert f"key={key.replace('/', '%2F')}" in page, key
    assert 'data-layer-picker="chart-expert-load"' in page
    assert page.count('<option value="') >= 2  # one layer per block of the MoE model
    assert "/static/dashboard/plotly.min.js" in page and "/static/dashboard/live.js" in page


def test_dense_run_page_leaves_out_moe_charts(alice, make_run):
    run = make_run(preset="dense-grpo")
    page = alice.get(f"/runs/{run.pk}/").content.decode()
    assert "key=mismatch%2Fkl_k3" in page
    assert "routing_inconsistency" not in page
    assert "data-layer-picker" not in page


def test_compare_page_diffs_only_differing_fields(alice, make_run):
    a = make_run(seed=0)
    b = make_run(seed=1, overrides={"stabilizers.replay.mode": "r3"})
    page = alice.get("/compare/", {"runs": f"{a.pk},{b.pk}", "baseline": b.pk}).content.decode()
    diff = page.split('class="config-diff"')[1].split("</table>")[0]
    assert "<code>run.seed</code>" in diff
    assert "<code>stabilizers.replay.mode</code>" in diff
    assert "model.n_experts" not in diff  # equal in both runs
    assert f"runs={a.pk}%2C{b.pk}" in page and f"baseline={b.pk}" in page
    assert f'id="heatmap-{a.pk}"' in page and f'id="heatmap-{b.pk}"' in page
    assert "scale=shared" in page and "One color scale for every run: 0 to 4x" in page
    assert 'class="baseline-row"' in page


def test_compare_page_without_runs_explains(alice, db):
    assert b"No runs chosen" in alice.get("/compare/").content


def test_experiment_page_lists_variants_and_band_charts(alice, make_run, experiment):
    make_run(variant="r3", seed=0)
    make_run(variant="r3", seed=1)
    make_run(variant="none", seed=0)
    page = alice.get(f"/experiments/{experiment.pk}/", {"band": "std"}).content.decode()
    assert "Experiment: replay vs none" in page
    assert f"/experiments/{experiment.pk}/chart?key=reward%2Faccuracy&amp;band=std" in page
    assert page.count('class="swatch"') == 2
    assert f"/stability/?experiment={experiment.pk}" in page


def test_sweep_page_groups_grid_points(alice, user, experiment):
    sweep = sweeps.create_sweep(
        owner=user,
        experiment=experiment,
        base_config=experiment.base_config,
        grid={"stabilizers.replay.mode": ["none", "r3"]},
        seeds=[0, 1],
        queue="cpu",
        name="replay sweep",
    )
    for run in sweep.runs.all():
        ingest_metrics(run.pk, records(5, reward__accuracy=lambda s: 0.5))
    page = alice.get(f"/sweeps/{sweep.pk}/").content.decode()
    assert "Sweep: replay sweep" in page
    assert "stabilizers.replay.mode=none" in page and "stabilizers.replay.mode=r3" in page
    response = alice.get(f"/sweeps/{sweep.pk}/chart", {"key": "reward/accuracy"})
    variants = {t["meta"]["variant"] for t in response.json()["figure"]["data"]}
    assert variants == {"stabilizers.replay.mode=none", "stabilizers.replay.mode=r3"}


def _variant_rows(page: str) -> dict[str, list[str]]:
    table = page.split('<table class="variants">')[1].split("</table>")[0]
    rows = {}
    for row in re.findall(r"<tr><td>(.*?)</tr>", table.split("<tbody>")[1], re.S):
        cells = [re.sub(r"<[^>]+>", "", c).strip() for c in row.split("</td><td>")]
        rows[cells[0]] = [c.replace("</td>", "").strip() for c in cells[1:]]
    return rows


def test_variants_table_counts_only_seeds(alice, make_run, experiment):
    """A cancelled or failed run is not a seed of its variant (the stability
    review's rule, dashboard/review/seeds.py): counted apart, and the rule is stated."""
    make_run(variant="r3", seed=0)
    make_run(variant="r3", seed=1)
    make_run(variant="r3", seed=2, status=RunStatus.CANCELLED)
    make_run(variant="r3", seed=3, status=RunStatus.FAILED)
    page = alice.get(f"/experiments/{experiment.pk}/").content.decode()
    assert _variant_rows(page)["r3"] == ["2", "0", "2"]  # seeds, active, stopped
    assert "Cancelled and failed runs are not seeds" in page


def test_sweep_page_shows_the_sweep_not_the_experiment_again(alice, user, experiment):
    """The sweep page: its grid, how far it is, its own actions; the experiment's
    actions (new run, sweep builder, sharing) stay on the experiment page."""
    sweep = sweeps.create_sweep(
        owner=user, experiment=experiment, base_config=experiment.base_config,
        grid={"stabilizers.replay.mode": ["none", "r3"]}, seeds=[0, 1], queue="cpu",
        name="replay sweep",
    )  # fmt: skip
    first = sweep.runs.order_by("pk").first()
    Run.objects.filter(pk=first.pk).update(status=RunStatus.CANCELLED)
    page = alice.get(f"/sweeps/{sweep.pk}/").content.decode()
    assert "Sweep builder" not in page and "New run" not in page and "Sharing" not in page
    assert "<code>stabilizers.replay.mode</code></td><td>none, r3</td>" in page
    assert "0 of 4 runs finished, 3 queued or training, 1 cancelled or failed." in page
    assert "Cancel sweep" in page
    experiment_page = alice.get(f"/experiments/{experiment.pk}/").content.decode()
    assert "Sweep builder" in experiment_page and "Cancel sweep" not in experiment_page


def test_run_page_is_the_one_run_page(alice, make_run):
    """Cancel/delete, clone, summary, config and comments live on the dashboard run page;
    the old /dashboard/ URL redirects here."""
    run = make_run(summary={"final_accuracy": 0.75})
    page = alice.get(f"/runs/{run.pk}/").content.decode()
    assert f'href="/experiments/{run.experiment_id}/runs/new?clone={run.pk}"' in page
    assert f'action="/runs/{run.pk}/delete"' in page
    assert "<h2>Summary</h2>" in page and "<h2>Config</h2>" in page
    assert 'id="comments"' in page and f'action="/runs/{run.pk}/"' in page
    moved = alice.get(f"/dashboard/runs/{run.pk}/")
    assert moved.status_code == 301 and moved["Location"] == f"/runs/{run.pk}/"


def test_experiment_page_is_the_one_experiment_page(alice, make_run, experiment):
    run = make_run(summary={"final_accuracy": 0.75})
    page = alice.get(f"/experiments/{experiment.pk}/").content.decode()
    assert "New run" in page and "Sweep builder" in page and "0.750" in page
    assert f'href="/runs/{run.pk}/"' in page and 'id="comments"' in page
    moved = alice.get(f"/dashboard/experiments/{experiment.pk}/")
    assert moved.status_code == 301
    assert moved["Location"] == f"/experiments/{experiment.pk}/"


def test_a_new_registry_entry_is_charted_with_no_other_change(alice, make_run, monkeypatch):
    """Charting a metric is one MetricSpec in trainer.metric_keys: the run page shows
    it in its section (a new section after the known ones), titled from the spec,
    and its chart endpoint formats the axis from the spec."""
    from trainer import metric_keys as mk

    spec = mk.MetricSpec(
        "router/aux_share", "aux share of routed tokens", mk.SHARE, section="Router extras"
    )
    monkeypatch.setitem(mk.METRIC_SPECS, spec.key, spec)
    run = make_run(records=records(5, router__aux_share=lambda s: 0.25))
    page = alice.get(f"/runs/{run.pk}/").content.decode()
    section = page.split("<h2>Router extras</h2>")[1].split("</section>")[0]
    assert "key=router%2Faux_share" in section
    assert page.index("<h2>Router extras</h2>") > page.index("<h2>Gradients</h2>")
    chart = alice.get(f"/runs/{run.pk}/chart", {"key": spec.key}).json()["figure"]
    assert chart["layout"]["yaxis"]["title"]["text"] == "aux share of routed tokens"
    assert chart["layout"]["yaxis"]["tickformat"] == ".0%"
    compare = alice.get("/compare/", {"runs": run.pk}).content.decode()
    assert "key=router%2Faux_share" in compare
