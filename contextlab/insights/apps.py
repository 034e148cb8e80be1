from __future__ import annotations

from django.apps import AppConfig


class InsightsConfig(AppConfig):
    name = "contextlab.insights"
    label = "contextlab_insights"
    verbose_name = "ContextLab insights"
