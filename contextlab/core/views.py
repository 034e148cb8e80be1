from __future__ import annotations

from django.http import HttpRequest, HttpResponsePermanentRedirect, JsonResponse
from django.templatetags.static import static
from django.views.decorators.http import require_GET, require_safe


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True})


@require_safe
def favicon(request: HttpRequest) -> HttpResponsePermanentRedirect:
    # Browsers ask for /favicon.ico on pages that name no icon (the admin's, a
    # JSON answer); ours is an SVG among the static files.
    return HttpResponsePermanentRedirect(static("favicon.svg"))
