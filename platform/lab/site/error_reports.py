"""What Django's debug error page may show of the settings."""

import re

from django.views.debug import SafeExceptionReporterFilter


class CredentialHidingFilter(SafeExceptionReporterFilter):
    """Django's filter hides settings named like keys and passwords; database
    and broker URLs (``postgres://lab:secret@db``) carry passwords in their
    values, so every setting named like a URL, database or broker is hidden too."""

    hidden_settings = re.compile(
        "API|TOKEN|KEY|SECRET|PASS|SIGNATURE|HTTP_COOKIE|URL|DATABASE|BROKER", flags=re.I
    )
