from __future__ import annotations

from django.apps import AppConfig


def import_too_large_page() -> bytes:
    """The page a browser gets when its upload passes the request limit, before the import view runs."""
    from django.conf import settings
    from django.template.loader import render_to_string
    from django.urls import reverse

    return render_to_string("413.html", {"limit": int(settings.CONTEXTLAB_MAX_UPLOAD_BYTES),
                                         "back": reverse("cl-import")}).encode()


class DashboardConfig(AppConfig):
    name = "contextlab.dashboard"
    label = "contextlab_dashboard"
    verbose_name = "ContextLab dashboard"

    def ready(self) -> None:
        from contextlab.core import bodylimit

        # The import form is posted by a browser: its refusal is a page a person reads, not JSON.
        bodylimit.REFUSAL_PAGES["cl-import"] = import_too_large_page
