"""Filters and tags of the dashboard templates.

None of them marks anything safe: untrusted text goes through ``clean`` (which
only drops terminal escape codes) and is then escaped like everything else.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django import template
from django.urls import reverse

from contextlab.lib import textsafe

register = template.Library()


@register.filter
def bytes_h(value: Any) -> str:
    """1,537 B · 12.3 KB · 4.5 MB."""
    try:
        size = float(value)
    except (TypeError, ValueError):
        return "–"
    if size < 1024:
        return f"{int(size):,} B"
    for unit in ("KB", "MB", "GB"):
        size /= 1024
        if size < 1024 or unit == "GB":
            return f"{size:,.1f} {unit}"
    return f"{size:,.1f} GB"


@register.filter
def clean(value: Any) -> str:
    return textsafe.clean(str(value or ""))


@register.filter
def preview(value: Any) -> textsafe.Preview:
    return textsafe.preview(str(value or ""))


@register.filter
def excerpt(value: Any, limit: int = 160) -> str:
    return textsafe.excerpt(str(value or ""), int(limit))


@register.filter
def signed(value: Any) -> str:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return str(value)
    return f"+{number:,}" if number > 0 else f"{number:,}".replace("-", "−")


@register.simple_tag
def file_url(session_id: UUID | str, path: str, line: int | None = None) -> str:
    """The owner-only text view of a workspace file, at ``line`` for an archive record."""
    url = reverse("cl-session-file", args=[session_id, path])
    return f"{url}?line={line}" if line else url


@register.simple_tag
def page_url(base: str, page: int, **extra: Any) -> str:
    """``base?page=N`` plus the extra query parameters that are set."""
    from urllib.parse import urlencode

    params = {"page": page, **{k: v for k, v in extra.items() if v not in (None, "")}}
    return f"{base}?{urlencode(params)}"
