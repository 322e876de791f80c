from django.apps import AppConfig


class ReviewConfig(AppConfig):
    """Team review's tables. The label stays ``dashboard`` (the app's label before
    dashboard/ had rooms), so the tables (``dashboard_verdict``, ...) and the
    migration history of existing databases are unchanged
    (tests/dashboard/test_review_migration.py)."""

    name = "dashboard.review"
    label = "dashboard"
    verbose_name = "Stability dashboards: team review"
