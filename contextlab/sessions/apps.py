from __future__ import annotations

from django.apps import AppConfig


class SessionsConfig(AppConfig):
    name = "contextlab.sessions"
    # Not "sessions": django.contrib.sessions (login sessions) already owns that
    # label, and two apps may not share one.
    label = "contextlab_sessions"
    verbose_name = "Agent sessions"
    default_auto_field = "django.db.models.BigAutoField"
