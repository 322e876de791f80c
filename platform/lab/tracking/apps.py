from django.apps import AppConfig


class TrackingConfig(AppConfig):
    name = "lab.tracking"
    label = "tracking"
    default_auto_field = "django.db.models.BigAutoField"
