"""A Content-Security-Policy on every HTML page.

Scripts come only from this origin: no inline ``<script>``, no ``hx-on``
attributes, no ``eval`` (htmx runs with ``allowEval`` off, see base.html). What a
session shows is an agent's data — tool output, transcripts — so a slip in
escaping somewhere must not become script. Style *attributes* stay allowed (the
bars and markers are sized by ``style="width: …"``); style sheets come only
from this origin too. ``CONTEXTLAB_CSP`` replaces the whole policy, for a
deployment that serves static files from a CDN.
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponseBase
from django.utils.deprecation import MiddlewareMixin

POLICY = "; ".join([
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self'",
    "style-src-attr 'unsafe-inline'",
    "img-src 'self' data:",
    # 'self' covers the page's own ws:// and wss:// origin (CSP level 3) for the live socket.
    "connect-src 'self'",
    "font-src 'self'",
    "object-src 'none'",
    "base-uri 'self'",
    "form-action 'self'",
    "frame-ancestors 'self'",
])


def policy() -> str:
    return str(getattr(settings, "CONTEXTLAB_CSP", "") or POLICY)


class ContentSecurityPolicyMiddleware(MiddlewareMixin):
    """Adds the policy to HTML responses that do not set one of their own."""

    def process_response(self, request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
        content_type = response.get("Content-Type", "")
        if content_type.startswith("text/html") and "Content-Security-Policy" not in response:
            response["Content-Security-Policy"] = policy()
        return response
