"""The site: admin, the API, logins, and the web wing (dashboard.web.urls) at the root.

The web wing's pages once lived under ``/dashboard/``; those addresses redirect
permanently to the same path at the root (dashboard.web.urls).
"""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", include("lab.api.urls")),
    path("", include("lab.tracking.urls")),
    path("accounts/", include("django.contrib.auth.urls")),
    path("", include("dashboard.web.urls")),
]
