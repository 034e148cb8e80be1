from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from contextlab.api import docs as api_docs
from contextlab.core.login_throttle import ThrottledAdminAuthenticationForm, ThrottledAuthenticationForm
from contextlab.gateway import otlp

admin.site.login_form = ThrottledAdminAuthenticationForm

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/login/", auth_views.LoginView.as_view(authentication_form=ThrottledAuthenticationForm),
         name="login"),
    path("accounts/", include("django.contrib.auth.urls")),
    # Before the API: its catch-all answers every other /api/v1/ path with a JSON 404.
    path("", include("contextlab.insights.urls")),
    # The API reference, read from the same OpenAPI document /api/v1/openapi.json serves.
    path("api/docs", api_docs.api_docs, name="cl-api-docs"),
    path("api/", api_docs.api_root, name="cl-api-root"),
    path("api/v1/", include("contextlab.api.urls")),
    # The OpenAI-compatible gateway: an agent's client points its base_url here.
    path("v1/", include("contextlab.gateway.urls")),
    # An OTLP/HTTP trace receiver: an exporter's endpoint is <server>/otlp (it adds /v1/traces).
    path("otlp/v1/traces", otlp.traces, name="cl-otlp-traces"),
    path("", include("contextlab.core.urls")),
    path("", include("contextlab.dashboard.urls")),
]
