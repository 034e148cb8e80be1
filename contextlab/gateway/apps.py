from __future__ import annotations

from django.apps import AppConfig


class GatewayConfig(AppConfig):
    name = "contextlab.gateway"
    label = "gateway"
    verbose_name = "OpenAI-compatible gateway"
    default_auto_field = "django.db.models.BigAutoField"
