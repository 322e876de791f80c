"""WSGI entry point: ``gunicorn lab.site.wsgi:application`` (the package is installed)."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lab.site.settings")

from django.core.wsgi import get_wsgi_application

application = get_wsgi_application()
