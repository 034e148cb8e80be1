from __future__ import annotations

from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "contextlab.core"
    label = "core"
    verbose_name = "ContextLab"

    def ready(self) -> None:
        from contextlab.core import checks  # noqa: F401  (registers the system checks)
