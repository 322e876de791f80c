from django.apps import AppConfig


class AssetsConfig(AppConfig):
    name = "lab.assets"
    label = "assets"
    default_auto_field = "django.db.models.BigAutoField"
