from __future__ import annotations

import json
from typing import Any

from django import template

register = template.Library()


@register.filter
def pretty_json(value: Any) -> str:
    """JSON for reading. Returned unmarked, so autoescape still applies to it."""
    return json.dumps(value, ensure_ascii=False, indent=2, sort_keys=False, default=str)


@register.filter
def outcome_class(outcome: str) -> str:
    """The CSS modifier of an outcome or step status chip."""
    if outcome in ("compacted", "fired"):
        return "chip--fired"
    if outcome in ("compaction_failed", "failed", "over_budget"):
        return "chip--failed"
    if outcome in ("fallback_summary", "warning", "nothing_to_compact", "compaction_deferred"):
        return "chip--warning"
    if outcome == "skipped":
        return "chip--muted"
    return "chip--ok"
