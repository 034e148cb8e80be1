"""Filters of the insight templates. None marks anything safe: every value is escaped."""

from __future__ import annotations

from typing import Any

from django import template

register = template.Library()

_ACTION_CHIPS = {"keep": "chip--ok", "summarize": "chip--fired", "summarized": "chip--fired",
                 "externalize": "ins-chip--ext", "drop": "chip--warning", "lost": "chip--failed"}


@register.filter
def action_chip(action: Any) -> str:
    """The chip modifier of an eviction action (or "summarized"/"lost" in a comparison)."""
    return _ACTION_CHIPS.get(str(action), "chip--muted")


@register.filter
def status_chip(status: Any) -> str:
    """ok / failed / pending (an operation), open / done / failed (a subtask)."""
    return {"ok": "chip--ok", "done": "chip--ok", "failed": "chip--failed", "pending": "chip--muted",
            "open": "ins-chip--open"}.get(str(status), "chip--muted")


@register.filter
def lookup(mapping: Any, key: Any) -> Any:
    if isinstance(mapping, dict):
        return mapping.get(key)
    return None


@register.filter
def score(value: Any) -> str:
    try:
        return f"{float(value):.2f}"
    except (TypeError, ValueError):
        return "–"


@register.filter
def div1000(value: Any) -> float | str:
    """Milliseconds as seconds."""
    try:
        return float(value) / 1000.0
    except (TypeError, ValueError):
        return ""


@register.filter
def mode_label(mode: Any) -> str:
    """Where an eviction action lands, in words."""
    return {"message": "whole message", "in_place": "in place (call kept)", "round": "whole tool round"}.get(
        str(mode), str(mode or ""))
