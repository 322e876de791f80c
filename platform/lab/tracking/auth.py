"""Who is calling: the credentials an MLflow client sends, mapped to a lab user.

``MLFLOW_TRACKING_TOKEN`` arrives as ``Authorization: Bearer <token>``: the
lab's own API token (``manage.py lab_user`` prints one; DRF's ``Token``
table). ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD`` arrive as
HTTP basic: the lab login. ``Token <key>`` (the lab API's scheme) is taken
too. The user's rights are the lab's (lab.experiments.rights).

Checking a password costs what the password hasher is made to cost (PBKDF2,
about 0.24 s of CPU here), and an MLflow client sends the login with every
request: each batch of points would pay it. So a login once checked is
remembered for a few minutes (``VerifiedLogins``): by an HMAC of the
credentials under the site's secret, never the password, and only while the
user's stored password hash is the one it was checked against (a changed
password, or a deactivated user, is checked again at once).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import threading
import time
from collections import OrderedDict

from django.conf import settings
from django.contrib.auth import authenticate, get_user_model
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
        user = VERIFIED_LOGINS.user(request, username, password)
    else:
        raise _refused(f"unsupported authorization scheme {scheme!r} (use Bearer or Basic)")
    if user is None or not user.is_active:
        raise _refused("invalid credentials")
    return user


class VerifiedLogins:
    """Logins whose password was checked in the last ``ttl_s`` seconds, at most
    ``size`` of them (the oldest forgotten first), in this process.

    An entry maps an HMAC-SHA256 of (username, password) under SECRET_KEY to the
    user's id and the stored password hash it was checked against. A hit still
    reads the user: it counts only while that hash is unchanged (whether the user
    is active is ``request_user``'s check, on every request). A wrong password is
    never remembered, so it always pays the hasher.
    """

    def __init__(self, ttl_s: float = 300.0, size: int = 1024):
        self.ttl_s = ttl_s
        self.size = size
        self._entries: OrderedDict[bytes, tuple[int, str, float]] = OrderedDict()
        self._lock = threading.Lock()

    def user(self, request, username: str, password: str):
        """The active user these credentials name, or None."""
        digest = hmac.new(
            settings.SECRET_KEY.encode(), f"{username}\0{password}".encode(), hashlib.sha256
        ).digest()
        now = time.monotonic()
        with self._lock:
            entry = self._entries.get(digest)
        if entry is not None and entry[2] > now:
            user = get_user_model().objects.filter(pk=entry[0]).first()
            if (
                user is not None
                and hmac.compare_digest(user.password, entry[1])
                and user.get_username() == username
            ):
                return user
        user = authenticate(request, username=username, password=password)
        with self._lock:
            self._entries.pop(digest, None)
            if user is not None:
                self._entries[digest] = (user.pk, user.password, now + self.ttl_s)
                while len(self._entries) > self.size:
                    self._entries.popitem(last=False)
        return user


VERIFIED_LOGINS = VerifiedLogins()
