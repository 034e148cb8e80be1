"""Time travel on the session page: every panel as the session was at one turn.

The page follows the latest turn (its fragments are the live ones, pushed over
the websocket). Picking a turn (in the list, on the chart, with the scrubber)
swaps each panel for its version at that turn, with root ids that no push
targets: the gauge of that turn's payload, its decision flow and LLM view, the
messages the session had seen by then and where each one was, the tool outputs
cut by then, and the summary version it ran with. "Follow the latest" swaps
the live versions back.
"""

from __future__ import annotations

from typing import Any

from django.core.paginator import Paginator
from django.db.models import Max

from contextlab.dashboard import fragments
from contextlab.sessions.models import AgentSession, SessionMessage, SummaryVersion, Turn


def _last_seq(session: AgentSession, turn: Turn) -> int:
    """The newest message the session had seen when ``turn`` ran."""
    last_id = (turn.trace.get("payload") or {}).get("last_message_id")
    if last_id:
        seq = (SessionMessage.objects.filter(session=session, message_id=last_id).order_by()
               .values_list("seq", flat=True).first())
        if seq:
            return int(seq)
    # Nothing was live at that turn: what it compacted is all it had seen.
    found = SessionMessage.objects.filter(session=session, compacted_turn__lte=turn.number).aggregate(last=Max("seq"))
    return int(found["last"] or 0)


def _events_at(row: SessionMessage, events: list[dict[str, Any]], number: int) -> list[dict[str, Any]]:
    compacted = row.compacted_turn is not None and row.compacted_turn <= number
    truncated = row.truncated_turn is not None and row.truncated_turn <= number
    kept = []
    for event in events:
        kind = event["kind"]
        if kind in ("compacted", "archived") and not compacted:
            continue
        if kind == "truncated" and not truncated:
            continue
        if kind == "evicted" and int(event.get("turn") or 0) > number:
            continue
        kept.append(event)
    return kept


def fate_at(session: AgentSession, turn: Turn, *, page: str | int | None = 1) -> dict[str, Any]:
    """The messages seen by ``turn``, newest first, each where it was at that turn."""
    qs = session.messages.filter(seq__lte=_last_seq(session, turn)).order_by("-seq").defer("content")
    paged = Paginator(qs, fragments.MESSAGES_PER_PAGE).get_page(page)
    rows = fragments.fate_rows(session, list(paged.object_list))
    for item in rows:
        row: SessionMessage = item["row"]
        # In memory only, for this rendering: the status it had then.
        compacted = row.compacted_turn is not None and row.compacted_turn <= turn.number
        row.status = SessionMessage.Status.ARCHIVED if compacted else SessionMessage.Status.LIVE
        item["events"] = _events_at(row, item["events"], turn.number)
    return {"fate_page": paged, "fate_rows": rows, "fate_live": False, "fate_turn": turn.number}


def ledger_at(session: AgentSession, turn: Turn, *, page: str | int | None = 1) -> dict[str, Any]:
    """The tool outputs cut by ``turn``: stage-1 cuts of the messages seen, stage-2 cuts made by then."""
    last = _last_seq(session, turn)
    seen = SessionMessage.objects.filter(session=session, seq__lte=last)
    stage_two_later = seen.filter(truncated_turn__gt=turn.number).values("message_id")
    files = (session.offloaded_files.filter(message_id__in=seen.values("message_id"))
             .exclude(stage=2, message_id__in=stage_two_later).order_by("-pk"))
    context = fragments.ledger_context(session, page=page, files=files)
    return {**context, "ledger_live": False, "ledger_turn": turn.number}


def summary_at(session: AgentSession, turn: Turn) -> dict[str, Any]:
    version = (SummaryVersion.objects.filter(session=session, turn__lte=turn.number).order_by("-version")
               .only("version", "text", "turn").first())
    return {"summary_live": False, "summary_turn": turn.number,
            "summary_text": version.text if version else "", "summary_number": version.version if version else None}


def at_context(session: AgentSession, turn: Turn) -> dict[str, Any]:
    """Every panel at ``turn`` (pinned versions, never pushed)."""
    context: dict[str, Any] = {"session": session}
    context.update(fragments.gauge_context(session, turn, now=False))
    context["gauge_live"] = False
    context.update(fragments.flow_context(session, turn, live=False))
    context.update(fragments.llm_context(session, turn, live=False))
    context.update(fate_at(session, turn))
    context.update(ledger_at(session, turn))
    context.update(summary_at(session, turn))
    context.update(fragments.timebar_context(session, turn, live=False))
    return context
