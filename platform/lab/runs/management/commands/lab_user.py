"""Create a login with an API token, or print an existing user's token, or reset an
existing user's password; print the credentials.

    manage.py lab_user --username alice                # new: password + token; existing: new password
    manage.py lab_user --username alice --token-only   # the token only; an existing user is unchanged
    manage.py lab_user --username root --superuser     # staff + superuser (promotes, never demotes)

An existing user's rights only ever grow (``--superuser``); they are never taken
away here (Django's admin does that), so running the command an integration
guide gives for a token cannot demote an administrator. Bad input exits 2 with a
message.
"""

from __future__ import annotations

import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from rest_framework.authtoken.models import Token


class Command(BaseCommand):
    help = (
        "Create a login (default: demo, an ordinary user; --superuser for an administrator) "
        "and print password and API token; for an existing user, reset the password, or "
        "with --token-only print the token and change nothing."
    )

    def add_arguments(self, parser):
        parser.add_argument("--username", default="demo")
        parser.add_argument("--password", default=None, help="default: random")
        parser.add_argument(
            "--superuser", action="store_true", help="staff + superuser (Django admin, any run)"
        )
        parser.add_argument(
            "--token-only",
            action="store_true",
            help="print just the token; an existing user's password and rights stay as they are",
        )

    def handle(self, *args, username, password, superuser, token_only, **opts):
        users = get_user_model()
        field = users._meta.get_field(users.USERNAME_FIELD)
        try:
            username = field.clean(username, None)
        except Exception as exc:  # django ValidationError: too long, empty, bad characters
            messages = getattr(exc, "messages", [str(exc)])
            raise CommandError(f"--username: {'; '.join(messages)}", returncode=2) from None
        with transaction.atomic():
            user = users.objects.filter(**{users.USERNAME_FIELD: username}).first()
            created = user is None
            if created:
                user = users(**{users.USERNAME_FIELD: username})
                user.set_password(password or secrets.token_urlsafe(9))
                user.is_staff = user.is_superuser = superuser
                user.save()
            elif token_only:
                if password is not None or superuser:
                    raise CommandError(
                        "--token-only never changes an existing user: drop --password and "
                        "--superuser, or drop --token-only to change them",
                        returncode=2,
                    )
            else:
                password = password or secrets.token_urlsafe(9)
                user.set_password(password)
                if superuser:  # promote on request; never demote (Django's admin does)
                    user.is_staff = user.is_superuser = True
                user.save()
            token, _ = Token.objects.get_or_create(user=user)
        if token_only:
            self.stdout.write(token.key)
        else:
            self.stdout.write(f"user {username}  password {password}  api token {token.key}")
