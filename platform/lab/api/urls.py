from django.urls import path

from lab.api import assets, views
from lab.api.openapi import OpenApiView

urlpatterns = [
    path("health", views.health_view, name="api-health"),
    path("schema/config", views.config_schema_view, name="api-config-schema"),
    path("openapi", OpenApiView.as_view(), name="api-openapi"),
    path("presets", views.presets_view, name="api-presets"),
    path("experiments", views.ExperimentList.as_view(), name="api-experiments"),
    path("experiments/<int:pk>", views.ExperimentDetail.as_view(), name="api-experiment"),
    path("runs", views.RunList.as_view(), name="api-runs"),
    path("runs/<int:pk>", views.RunDetail.as_view(), name="api-run"),
    path("runs/<int:pk>/cancel", views.RunCancel.as_view(), name="api-run-cancel"),
    path("runs/<int:pk>/clone", views.RunClone.as_view(), name="api-run-clone"),
    path("runs/<int:pk>/exports", views.RunExports.as_view(), name="api-run-exports"),
    path("runs/<int:pk>/metrics", views.RunMetrics.as_view(), name="api-run-metrics"),
    path("runs/<int:pk>/comments", views.RunComments.as_view(), name="api-run-comments"),
    path("sweeps", views.SweepCreate.as_view(), name="api-sweeps"),
    *(
        path(
            f"sweeps/<int:pk>/{action}",
            views.SweepAction.as_view(action=action),
            name=f"api-sweep-{action}",
        )
        for action in views.SweepAction.SERVICES
    ),
    path("models", assets.ModelList.as_view(), name="api-models"),
    path("models/<int:pk>", assets.ModelDetail.as_view(), name="api-model"),
    path("datasets", assets.DatasetList.as_view(), name="api-datasets"),
    path("datasets/<int:pk>", assets.DatasetDetail.as_view(), name="api-dataset"),
    path("queue", views.queue_view, name="api-queue"),
    path("workers", views.workers_view, name="api-workers"),
]
