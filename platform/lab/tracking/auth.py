"""Who is calling: the credentials an MLflow client sends, mapped to a lab user.

``MLFLOW_TRACKING_TOKEN`` arrives as ``Authorization: Bearer <token>``: the
lab's own API token (``manage.py lab_user`` prints one; DRF's ``Token``
table). ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD`` arrive as
HTTP basic: the lab login. ``Token <key>`` (the lab API's scheme) is taken
too. The user's rights are the lab's (lab.experiments.rights).
"""

from __future__ import annotations

import base64
import binascii

from django.contrib.auth import authenticate
from rest_framework.authtoken.models import Token

from lab.tracking.errors import UNAUTHENTICATED, MlflowError


def _refused(why: str) -> MlflowError:
    return MlflowError(UNAUTHENTICATED, why)


def request_user(request):
    """The active lab user the request's credentials name; MlflowError UNAUTHENTICATED."""
    header = request.META.get("HTTP_AUTHORIZATION", "")
    scheme, _, credentials = header.partition(" ")
    scheme, credentials = scheme.lower(), credentials.strip()
    if not header:
        raise _refused(
            "credentials required: set MLFLOW_TRACKING_TOKEN to a lab API token, or "
            "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD to a lab login"
        )
    if scheme in ("bearer", "token"):
        if not credentials or len(credentials) > 200:
            raise _refused("invalid token")
        token = Token.objects.select_related("user").filter(key=credentials).first()
        user = token.user if token is not None else None
    elif scheme == "basic":
        try:
            decoded = base64.b64decode(credentials, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise _refused("malformed basic credentials") from None
        username, sep, password = decoded.partition(":")
        if not sep or len(username) > 150 or "\x00" in decoded:
            raise _refused("malformed basic credentials")
        user = authenticate(request, username=username, password=password)
    else:
        raise _refused(f"unsupported authorization scheme {scheme!r} (use Bearer or Basic)")
    if user is None or not user.is_active:
        raise _refused("invalid credentials")
    return user
