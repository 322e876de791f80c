from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Worker lifecycle signals (registry heartbeats) connect on import.
        from jobs import signals  # noqa: F401
