from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "lab.jobs"
    label = "jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Worker lifecycle signals (registry heartbeats) connect on import.
        from lab.jobs import signals  # noqa: F401
