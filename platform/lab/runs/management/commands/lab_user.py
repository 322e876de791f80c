"""Create (or reset) a user with an API token and print the credentials."""

from __future__ import annotations

import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from rest_framework.authtoken.models import Token


class Command(BaseCommand):
    help = (
        "Create or reset a login (default: demo, an ordinary user; --superuser for an "
        "administrator) and print password and API token."
    )

    def add_arguments(self, parser):
        parser.add_argument("--username", default="demo")
        parser.add_argument("--password", default=None, help="default: random")
        parser.add_argument(
            "--superuser", action="store_true", help="staff + superuser (Django admin, any run)"
        )
        parser.add_argument("--token-only", action="store_true", help="print just the token")

    def handle(self, *args, username, password, superuser, token_only, **opts):
        password = password or secrets.token_urlsafe(9)
        users = get_user_model().objects
        user, _ = users.get_or_create(username=username)
        user.set_password(password)
        user.is_staff = user.is_superuser = superuser
        user.save()
        token, _ = Token.objects.get_or_create(user=user)
        if token_only:
            self.stdout.write(token.key)
        else:
            self.stdout.write(f"user {username}  password {password}  api token {token.key}")
