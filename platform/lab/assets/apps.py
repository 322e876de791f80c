from django.apps import AppConfig


class AssetsConfig(AppConfig):
    name = "lab.assets"
    label = "assets"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # `manage.py check --deploy` warns about a deployment without LAB_ASSET_ROOTS.
        from lab.assets import system_checks  # noqa: F401
