from django.apps import AppConfig


class WebConfig(AppConfig):
    """The pages: views, URLs, forms, templates and static files. No models."""

    name = "dashboard.web"
    label = "dashboard_web"
    verbose_name = "Stability dashboards: pages"

    def ready(self) -> None:
        from dashboard.web import warmup

        warmup.connect()
