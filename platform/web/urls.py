from django.urls import path

from web import views

app_name = "web"
urlpatterns = [
    path("", views.home, name="home"),
    path("experiments/", views.experiment_list, name="experiments"),
    path("experiments/<int:pk>/", views.experiment_detail, name="experiment"),
    path("experiments/<int:pk>/runs/new", views.run_new, name="run-new"),
    path("experiments/<int:pk>/sweeps/new", views.sweep_new, name="sweep-new"),
    path("runs/<int:pk>/", views.run_detail, name="run"),
    path("runs/<int:pk>/cancel", views.run_cancel, name="run-cancel"),
    path("runs/<int:pk>/delete", views.run_delete, name="run-delete"),
    path("queue/", views.queue_page, name="queue"),
    path("workers/", views.workers_page, name="workers"),
    path("presets/<str:name>.json", views.preset_json, name="preset-json"),
]
