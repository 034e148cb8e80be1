from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/v1/", include("contextlab.api.urls")),
    path("", include("contextlab.core.urls")),
    path("", include("contextlab.sessions.urls")),
]
