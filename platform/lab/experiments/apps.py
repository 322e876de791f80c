from django.apps import AppConfig


class ExperimentsConfig(AppConfig):
    name = "lab.experiments"
    label = "experiments"
    default_auto_field = "django.db.models.BigAutoField"
