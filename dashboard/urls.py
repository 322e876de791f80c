"""Dashboard URLs (namespace "dashboard")."""

from django.urls import path
from django.views.generic import RedirectView

from dashboard.views import endpoints, pages, review

app_name = "dashboard"

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="dashboard:runs"), name="home"),
    # pages
    path("runs/", pages.runs_list, name="runs"),
    path("runs/<int:run_id>/", pages.run_detail, name="run"),
    path("experiments/<int:experiment_id>/", pages.experiment_detail, name="experiment"),
    path("sweeps/<int:sweep_id>/", pages.sweep_detail, name="sweep"),
    path("compare/", pages.compare, name="compare"),
    path("comparisons/", pages.comparisons_list, name="comparisons"),
    path("comparisons/<int:comparison_id>/", pages.comparison_detail, name="comparison"),
    path("stability/", pages.stability, name="stability"),
    # chart endpoints (live.js) and downloads
    path("runs/<int:run_id>/chart", endpoints.run_chart, name="run_chart"),
    path("runs/<int:run_id>/heatmap", endpoints.run_heatmap, name="run_heatmap"),
    path("runs/<int:run_id>/status", endpoints.run_status, name="run_status"),
    path(
        "experiments/<int:experiment_id>/chart", endpoints.experiment_chart, name="experiment_chart"
    ),
    path("sweeps/<int:sweep_id>/chart", endpoints.sweep_chart, name="sweep_chart"),
    path("compare/chart", endpoints.compare_chart, name="compare_chart"),
    path("compare/charts", endpoints.compare_charts, name="compare_charts"),
    path("stability/chart/<str:chart>", endpoints.stability_chart, name="stability_chart"),
    path("stability/table", endpoints.stability_table, name="stability_table"),
    # team review
    path("runs/<int:run_id>/verdict", review.verdict_run, name="verdict_run"),
    path("runs/<int:run_id>/pin", review.pin_run, name="pin_run"),
    path("verdicts/<int:verdict_id>/withdraw", review.withdraw_verdict, name="withdraw_verdict"),
    path("experiments/<int:experiment_id>/unpin", review.unpin_experiment, name="unpin_experiment"),
    path("comparisons/save", review.save_comparison, name="save_comparison"),
    path(
        "comparisons/<int:comparison_id>/delete", review.delete_comparison, name="delete_comparison"
    ),
    path(
        "comparisons/<int:comparison_id>/comment",
        review.comment_comparison,
        name="comment_comparison",
    ),
]
