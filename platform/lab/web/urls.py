from django.contrib.auth.decorators import login_required
from django.templatetags.static import static
from django.urls import path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularSwaggerView

from lab.web import views

app_name = "web"
urlpatterns = [
    path("", views.home, name="home"),
    path("experiments/", views.experiment_list, name="experiments"),
    path("experiments/<int:pk>/", views.experiment_page_moved, name="experiment"),
    path("experiments/<int:pk>/sharing", views.experiment_sharing, name="experiment-sharing"),
    path("experiments/<int:pk>/runs/new", views.run_new, name="run-new"),
    path("experiments/<int:pk>/sweeps/new", views.sweep_new, name="sweep-new"),
    path("runs/<int:pk>/", views.run_page_moved, name="run"),
    path("runs/<int:pk>/cancel", views.run_cancel, name="run-cancel"),
    path("runs/<int:pk>/delete", views.run_delete, name="run-delete"),
    path("runs/<int:pk>/requeue", views.run_requeue, name="run-requeue"),
    path("runs/<int:pk>/export", views.run_export, name="run-export"),
    path("runs/new", views.run_new_any, name="run-new-any"),
    path("runs/bulk", views.runs_bulk, name="runs-bulk"),
    path("sweeps/<int:pk>/cancel", views.sweep_cancel, name="sweep-cancel"),
    path("queue/", views.queue_page, name="queue"),
    path("workers/", views.workers_page, name="workers"),
    path("presets/<str:name>.json", views.preset_json, name="preset-json"),
    # Browsable API docs of /api/openapi (the API's URLconf is matched first; these
    # paths are not in it). Swagger UI only: drf-spectacular's ReDoc page pulls web
    # fonts from Google. Static files of drf-spectacular-sidecar, no CDN.
    path(
        "api/docs/",
        login_required(SpectacularSwaggerView.as_view(url_name="api-openapi")),
        name="api-docs",
    ),
    # Browsers ask for /favicon.ico whatever the page says.
    path("favicon.ico", RedirectView.as_view(url=static("web/favicon.svg"), permanent=True)),
]
