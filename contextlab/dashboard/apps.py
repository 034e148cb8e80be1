from __future__ import annotations

from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "contextlab.dashboard"
    label = "contextlab_dashboard"
    verbose_name = "ContextLab dashboard"
