"""The web wing's URLs (namespace "dashboard"): one tree per concept, a page at
``/<concept>/<id>/`` and its actions, charts and downloads under it.

The site mounts them at the root (lab.site.urls); the old ``/dashboard/...``
addresses answer with a permanent redirect to the same path without the prefix
(views/legacy.py).
"""

from django.contrib.auth.decorators import login_required
from django.templatetags.static import static
from django.urls import path, re_path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularSwaggerView

from dashboard.web.views import (
    actions,
    assets,
    compare_pages,
    endpoints,
    external_runs,
    forms,
    legacy,
    queue,
    review,
    run_pages,
    runs_table,
    stability_page,
    sweep_builder,
    variant_pages,
)

app_name = "dashboard"

urlpatterns = [
    path("", forms.home, name="home"),
    re_path(r"^dashboard/(?P<rest>.*)$", legacy.moved, name="legacy"),
    # runs
    path("runs/", run_pages.runs_list, name="runs"),
    path("runs/new", forms.run_new_any, name="run_new_any"),
    path("runs/bulk", actions.runs_bulk, name="runs_bulk"),
    path("runs/<int:run_id>/", run_pages.run_detail, name="run"),
    path("runs/<int:pk>/cancel", actions.run_cancel, name="run_cancel"),
    path("runs/<int:pk>/delete", actions.run_delete, name="run_delete"),
    path("runs/<int:pk>/restore", actions.run_restore, name="run_restore"),
    path("runs/<int:pk>/requeue", actions.run_requeue, name="run_requeue"),
    path("runs/<int:pk>/end", actions.run_end, name="run_end"),
    path("runs/<int:pk>/export", actions.run_export, name="run_export"),
    path("runs/<int:run_id>/verdict", review.verdict_run, name="verdict_run"),
    path("runs/<int:run_id>/pin", review.pin_run, name="pin_run"),
    path("runs/<int:run_id>/chart", endpoints.run_chart, name="run_chart"),
    path("runs/<int:run_id>/heatmap", endpoints.run_heatmap, name="run_heatmap"),
    path("runs/<int:run_id>/status", endpoints.run_status, name="run_status"),
    path("runs/<int:run_id>/distribution", external_runs.run_distribution, name="run_distribution"),
    path("runs/<int:run_id>/artifacts", external_runs.run_artifact, name="run_artifact"),
    path("runs/<int:run_id>/models/<str:model_id>", external_runs.run_model, name="run_model"),
    path("verdicts/<int:verdict_id>/withdraw", review.withdraw_verdict, name="withdraw_verdict"),
    # experiments
    path("experiments/", forms.experiment_list, name="experiments"),
    path("experiments/<int:experiment_id>/", variant_pages.experiment_detail, name="experiment"),
    path("experiments/<int:pk>/sharing", forms.experiment_sharing, name="experiment_sharing"),
    path("experiments/<int:experiment_id>/table", runs_table.runs_table, name="runs_table"),
    path(
        "experiments/<int:experiment_id>/parallel", runs_table.runs_parallel, name="runs_parallel"
    ),
    path("experiments/<int:pk>/runs/new", forms.run_new, name="run_new"),
    path("experiments/<int:pk>/sweeps/new", sweep_builder.sweep_new, name="sweep_new"),
    path(
        "experiments/<int:experiment_id>/chart", endpoints.experiment_chart, name="experiment_chart"
    ),
    path("experiments/<int:experiment_id>/unpin", review.unpin_experiment, name="unpin_experiment"),
    # sweeps
    path("sweeps/<int:sweep_id>/", variant_pages.sweep_detail, name="sweep"),
    path("sweeps/<int:sweep_id>/chart", endpoints.sweep_chart, name="sweep_chart"),
    path("sweeps/<int:pk>/cancel", actions.sweep_action, {"action": "cancel"}, name="sweep_cancel"),
    path("sweeps/<int:pk>/pause", actions.sweep_action, {"action": "pause"}, name="sweep_pause"),
    path("sweeps/<int:pk>/resume", actions.sweep_action, {"action": "resume"}, name="sweep_resume"),
    path("sweeps/<int:pk>/clear", actions.sweep_action, {"action": "clear"}, name="sweep_clear"),
    # compare and saved comparisons
    path("compare/", compare_pages.compare, name="compare"),
    path("compare/chart", endpoints.compare_chart, name="compare_chart"),
    path("compare/charts", endpoints.compare_charts, name="compare_charts"),
    path("comparisons/", compare_pages.comparisons_list, name="comparisons"),
    path("comparisons/save", review.save_comparison, name="save_comparison"),
    path("comparisons/<int:comparison_id>/", compare_pages.comparison_detail, name="comparison"),
    path(
        "comparisons/<int:comparison_id>/delete", review.delete_comparison, name="delete_comparison"
    ),
    path(
        "comparisons/<int:comparison_id>/comment",
        review.comment_comparison,
        name="comment_comparison",
    ),
    # stability review
    path("stability/", stability_page.stability, name="stability"),
    path("stability/chart/<str:chart>", endpoints.stability_chart, name="stability_chart"),
    path("stability/table", endpoints.stability_table, name="stability_table"),
    # queue, workers, models & data
    path("queue/", queue.queue_page, name="queue"),
    path("workers/", queue.workers_page, name="workers"),
    path("assets/", assets.asset_list, name="assets"),
    path("presets/<str:name>.json", forms.preset_json, name="preset_json"),
    # Browsable API docs of /api/openapi (the API's URLconf is matched first; these
    # paths are not in it). Swagger UI only: drf-spectacular's ReDoc page pulls web
    # fonts from Google. Static files of drf-spectacular-sidecar, no CDN.
    path(
        "api/docs/",
        login_required(SpectacularSwaggerView.as_view(url_name="api-openapi")),
        name="api_docs",
    ),
    # Browsers ask for /favicon.ico whatever the page says.
    path(
        "favicon.ico",
        RedirectView.as_view(url=static("dashboard/favicon.svg"), permanent=True),
        name="favicon",
    ),
]
