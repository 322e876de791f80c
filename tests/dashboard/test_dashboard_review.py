"""Team review: escaped comments, verdicts, saved comparisons and their
permissions, pinned baselines, CSRF."""

from __future__ import annotations

import pytest
from django.test import Client
from teams import share

from dashboard.review.models import BaselinePin, ComparisonComment, SavedComparison, Verdict
from lab.runs.models import Comment
from tests.dashboard.conftest import payload_traces, records

XSS = '<script>alert("x")</script>\nsecond line & more'
XSS_ESCAPED = b"&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;<br>second line &amp; more"


def test_run_comment_is_rendered_escaped(alice, client_for, other_user, make_run):
    run = make_run()
    bob = client_for(other_user)  # anyone logged in may comment
    response = bob.post(f"/runs/{run.pk}/", {"body": XSS})
    assert response.status_code == 302
    assert response["Location"] == f"/runs/{run.pk}/#comments"
    comment = Comment.objects.get(run=run)
    assert comment.author == other_user and comment.body == XSS.strip()
    page = alice.get(f"/runs/{run.pk}/").content
    assert XSS_ESCAPED in page
    assert b'<script>alert("x")' not in page


def test_empty_comment_is_refused(alice, make_run):
    run = make_run()
    response = alice.post(f"/runs/{run.pk}/", {"body": "   "}, follow=True)
    assert b"a comment cannot be empty" in response.content
    assert not Comment.objects.exists()


def test_verdicts_latest_wins_and_only_author_or_staff_withdraw(
    alice, client_for, other_user, staff_user, user, make_run
):
    run = make_run()
    share(run.experiment, other_user)  # bob is on alice's team
    bob = client_for(other_user)
    assert alice.post(f"/runs/{run.pk}/verdict", {"label": "stable"}).status_code == 302
    assert (
        bob.post(f"/runs/{run.pk}/verdict", {"label": "needs_rerun", "note": "seed 2?"}).status_code
        == 302
    )
    assert [v.label for v in Verdict.objects.filter(run=run)] == ["needs_rerun", "stable"]
    listing = alice.get("/runs/").content.decode()
    assert 'class="verdict verdict-needs_rerun"' in listing
    assert "needs rerun" in listing

    alice.post(f"/runs/{run.pk}/verdict", {"label": "exploded"})
    assert Verdict.objects.filter(run=run).count() == 2  # unknown label stored nothing

    bobs = Verdict.objects.get(run=run, author=other_user)
    assert alice.post(f"/verdicts/{bobs.pk}/withdraw").status_code == 403
    assert Verdict.objects.filter(pk=bobs.pk).exists()
    assert bob.post(f"/verdicts/{bobs.pk}/withdraw").status_code == 302
    alices = Verdict.objects.get(run=run, author=user)
    assert client_for(staff_user).post(f"/verdicts/{alices.pk}/withdraw").status_code == 302
    assert not Verdict.objects.filter(run=run).exists()


@pytest.fixture
def two_runs(make_run):
    a = make_run(seed=0, records=records(10, reward__accuracy=lambda s: 0.5))
    b = make_run(
        seed=1,
        records=records(10, reward__accuracy=lambda s: 0.6),
        overrides={"stabilizers.replay.mode": "r3"},
    )
    return a, b


def test_saved_comparison_has_a_shareable_url(alice, client_for, other_user, two_runs):
    a, b = two_runs
    response = alice.post(
        "/comparisons/save",
        {"name": "r3 vs none", "runs": f"{a.pk},{b.pk}", "baseline": a.pk},
    )
    saved = SavedComparison.objects.get()
    assert response["Location"] == f"/comparisons/{saved.pk}/"
    assert saved.run_ids == [a.pk, b.pk] and saved.baseline_id == a.pk
    # a teammate opens the shared URL and sees the same runs, baseline and config diff
    page = client_for(other_user).get(f"/comparisons/{saved.pk}/").content.decode()
    assert "Comparison: r3 vs none" in page
    assert f"baseline={a.pk}" in page
    assert "stabilizers.replay.mode" in page
    assert "Delete this comparison" not in page  # bob is not the owner
    assert "r3 vs none" in alice.get("/comparisons/").content.decode()


def test_saved_comparison_refuses_bad_input(alice, two_runs):
    a, b = two_runs
    alice.post("/comparisons/save", {"name": "", "runs": f"{a.pk}"})
    alice.post("/comparisons/save", {"name": "x", "runs": f"{a.pk},999"})
    response = alice.post(
        "/comparisons/save",
        {"name": "x", "runs": f"{a.pk}", "baseline": b.pk},
        follow=True,
    )
    assert b"the baseline must be one of the compared runs" in response.content
    assert not SavedComparison.objects.exists()


def test_only_owner_or_staff_delete_a_saved_comparison(
    alice, client_for, other_user, staff_user, user, two_runs
):
    from dashboard.review import services

    a, b = two_runs
    first = services.save_comparison(owner=user, name="one", run_ids=[a.pk, b.pk])
    second = services.save_comparison(owner=user, name="two", run_ids=[a.pk])
    assert client_for(other_user).post(f"/comparisons/{first.pk}/delete").status_code == 403
    assert SavedComparison.objects.filter(pk=first.pk).exists()
    assert alice.post(f"/comparisons/{first.pk}/delete").status_code == 302
    assert client_for(staff_user).post(f"/comparisons/{second.pk}/delete").status_code == 302
    assert not SavedComparison.objects.exists()


def test_anyone_comments_on_a_saved_comparison_escaped(
    alice, client_for, other_user, user, two_runs
):
    from dashboard.review import services

    a, b = two_runs
    saved = services.save_comparison(owner=user, name="one", run_ids=[a.pk, b.pk])
    response = client_for(other_user).post(f"/comparisons/{saved.pk}/comment", {"body": XSS})
    assert response["Location"] == f"/comparisons/{saved.pk}/#comments"
    assert ComparisonComment.objects.get().author == other_user
    page = alice.get(f"/comparisons/{saved.pk}/").content
    assert XSS_ESCAPED in page and b'<script>alert("x")' not in page


def test_pinned_baseline_is_drawn_on_the_other_runs_charts(alice, two_runs):
    a, b = two_runs
    assert alice.post(f"/runs/{a.pk}/pin").status_code == 302
    assert BaselinePin.objects.get().run == a
    page = alice.get(f"/runs/{b.pk}/").content.decode()
    assert f"baseline={a.pk}" in page
    assert "Charts are drawn against" in page
    traces = payload_traces(alice.get(f"/runs/{b.pk}/chart", {"key": "reward/accuracy"}))
    assert [t["meta"]["role"] for t in traces] == ["baseline", "run"]
    assert traces[0]["name"] == f"#{a.pk} none s0 (baseline)"
    # ?baseline=0 hides it for this view; the baseline's own page draws no baseline
    assert (
        len(
            payload_traces(
                alice.get(f"/runs/{b.pk}/chart", {"key": "reward/accuracy", "baseline": 0})
            )
        )
        == 1
    )
    assert len(payload_traces(alice.get(f"/runs/{a.pk}/chart", {"key": "reward/accuracy"}))) == 1
    alice.post(f"/experiments/{a.experiment_id}/unpin")
    assert not BaselinePin.objects.exists()


def test_review_posts_need_the_csrf_token(user, make_run):
    run = make_run()
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    assert client.post(f"/runs/{run.pk}/", {"body": "hi"}).status_code == 403
    assert client.post(f"/runs/{run.pk}/verdict", {"label": "stable"}).status_code == 403
    assert not Comment.objects.exists() and not Verdict.objects.exists()


def test_review_actions_are_post_only(alice, make_run):
    run = make_run()
    assert alice.get(f"/runs/{run.pk}/verdict").status_code == 405
    assert alice.get(f"/runs/{run.pk}/pin").status_code == 405


@pytest.mark.parametrize(
    "body",
    ["", "   ", "bell \x07", "x" * 10001, 42],
    ids=["empty", "blank", "control", "long", "int"],
)
def test_every_comment_follows_one_body_rule(user, make_run, body):
    """A run's, an experiment's and a saved comparison's comments refuse the same
    bodies with the same message (lab.runs.comments.clean_body)."""
    from dashboard.review import services
    from trainer.errors import FieldError

    run = make_run()
    saved = services.save_comparison(owner=user, name="one", run_ids=[run.pk])
    writes = [
        lambda: services.comment_on_run(author=user, run=run, body=body),
        lambda: services.comment_on_experiment(author=user, experiment=run.experiment, body=body),
        lambda: services.comment_on_comparison(author=user, comparison=saved, body=body),
    ]
    messages = []
    for write in writes:
        with pytest.raises(FieldError) as refused:
            write()
        messages.append(refused.value.errors)
    assert messages[0] == messages[1] == messages[2] and messages[0][0][0] == "body"
    assert not Comment.objects.exists() and not ComparisonComment.objects.exists()
