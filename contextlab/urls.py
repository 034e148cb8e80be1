from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    # Before the API: its catch-all answers every other /api/v1/ path with a JSON 404.
    path("", include("contextlab.insights.urls")),
    path("api/v1/", include("contextlab.api.urls")),
    # The OpenAI-compatible gateway: an agent's client points its base_url here.
    path("v1/", include("contextlab.gateway.urls")),
    path("", include("contextlab.core.urls")),
    path("", include("contextlab.sessions.urls")),
]
