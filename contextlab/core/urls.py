from __future__ import annotations

from django.urls import path

from contextlab.core import views

urlpatterns = [
    path("healthz", views.healthz, name="cl-healthz"),
    path("favicon.ico", views.favicon, name="cl-favicon"),
]
