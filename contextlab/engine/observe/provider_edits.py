"""The provider's own context editing, as one step of a turn's decision flow.

Some providers edit the context on their side after the agent sent it:
Anthropic's ``context_management.edits`` (``clear_tool_uses_*``,
``clear_thinking_*``) asked for in the request, and ``applied_edits`` reported
in the answer (what was cleared, and how many input tokens that saved). That is
a loss boundary outside the agent and outside ContextLab's engine: the turn
shows what was asked and what was applied like any other truncation.
"""

from __future__ import annotations

from typing import Any

STEP = "provider_context_edits"
# The counts Anthropic reports per applied edit.
_COUNTS = ("cleared_input_tokens", "cleared_tool_uses", "cleared_thinking_turns")


def provider_edits_step(asked: Any, applied: Any, *, removed: list[dict[str, Any]] | None = None,
                        by: str = "the provider") -> dict[str, Any] | None:
    """The trace step for the edits asked for and applied; None when the call asked for none and got none.

    ``by``: who applied them ("ContextLab" when the engine ran them for an upstream that
    cannot); ``removed``: what each edit removed, when known (ContextLab's own run)."""
    asked_edits = [e for e in asked if isinstance(e, dict)] if isinstance(asked, list) else []
    applied_edits = [e for e in applied if isinstance(e, dict)] if isinstance(applied, list) else []
    if not asked_edits and not applied_edits:
        return None
    names = ", ".join(str(e.get("type") or "?") for e in asked_edits) or "none"
    numbers: dict[str, Any] = {"asked": len(asked_edits), "applied": len(applied_edits)}
    for key in _COUNTS:
        total = sum(e[key] for e in applied_edits if isinstance(e.get(key), int))
        if total or any(key in e for e in applied_edits):
            numbers[key] = total
    if applied_edits:
        outcome = (f"{by} applied {len(applied_edits)} context edit(s): "
                   + ", ".join(str(e.get("type") or "?") for e in applied_edits))
    else:
        outcome = f"asked for {names}; {by} applied none"
    reasons = [f"asked: {e.get('type')} " + ", ".join(f"{k}={v}" for k, v in e.items() if k != "type")
               for e in asked_edits]
    reasons += [f"applied: {e.get('type')} " + ", ".join(f"{k}={v}" for k, v in e.items() if k != "type")
                for e in applied_edits]
    return {"step": STEP, "status": "fired" if applied_edits else "ok", "started_at": "", "duration_ms": 0.0,
            "inputs": {}, "numbers": numbers, "outcome": outcome, "reasons": reasons,
            "details": {"asked": asked_edits, "applied": applied_edits, **({"removed": removed} if removed else {})}}
