"""``manage.py check --deploy``: a deployment that lets logins name any path."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Tags, Warning, register

NO_ROOTS = "lab.W001"


@register(Tags.security, deploy=True)
def asset_roots_set(app_configs=None, **kwargs) -> list[Warning]:
    """Without LAB_ASSET_ROOTS every path a user names (a registered model or
    dataset, a run's model.source or task.data_file) may be anywhere the web
    server and the workers can read."""
    if settings.LAB_ASSET_ROOTS:
        return []
    return [
        Warning(
            "LAB_ASSET_ROOTS is empty: logins may make the web server and the workers "
            "read any file they can (a checkpoint, a data file, anything else).",
            hint="Set LAB_ASSET_ROOTS to the shared volume(s) holding models and data "
            "(':'-separated), e.g. /data as in docker-compose.yml.",
            id=NO_ROOTS,
        )
    ]
