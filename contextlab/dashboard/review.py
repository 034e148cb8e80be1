"""What the compaction panel shows of a review: the pins, and the newest dry run's draft.

Kept apart from ``fragments`` so the panel's include files
(``_pins.html``, ``_compaction_review.html``) have one context builder.
"""

from __future__ import annotations

from typing import Any

from contextlab.dashboard.search import SearchResult
from contextlab.dashboard.why import story_hit
from contextlab.engine.stages.summary.plan import fingerprint
from contextlab.lib import summary_diff, textsafe
from contextlab.lib.blocks import first_text
from contextlab.sessions import services
from contextlab.sessions.models import AgentSession, CompactionRun, SessionMessage

DRAFT_ROWS = 40  # messages listed per side of a draft's split; the rest is a count


def message_rows(session: AgentSession, ids: list[str], *, limit: int | None = None) -> list[dict[str, Any]]:
    shown = ids if limit is None else ids[:limit]
    found = {m.message_id: m for m in SessionMessage.objects.filter(session=session, message_id__in=shown).order_by()
             .only("seq", "message_id", "role", "tokens", "current_content", "status", "session_id")}
    rows = []
    for message_id in shown:
        message = found.get(message_id)
        rows.append({"id": message_id, "message": message,
                     "excerpt": textsafe.excerpt(first_text(message.current_content), 120) if message else ""})
    return rows


def pins_context(session: AgentSession) -> dict[str, Any]:
    pins = services.pins_of(session)
    return {"pins": pins, "pinned_rows": message_rows(session, pins.message_ids),
            "pinned_ids": set(pins.message_ids)}


def draft_context(session: AgentSession) -> dict[str, Any]:
    run = services.latest_draft(session)
    if run is None or run.status not in (CompactionRun.Status.DRAFT, CompactionRun.Status.STALE) or not run.draft:
        return {"draft_run": run if run is not None and run.status in (CompactionRun.Status.DRAFT,
                                                                        CompactionRun.Status.STALE) else None}
    draft = run.draft["draft"]
    goes, stays = list(draft["compact_ids"]), list(draft["keep_ids"])
    current = textsafe.clean(session.summary or "")
    text = textsafe.clean(draft["summary"] or "")
    pinned_live = set(run.draft.get("pins", {}).get("message_ids") or [])
    return {
        "draft_run": run,
        "draft": draft,
        "draft_goes": message_rows(session, goes, limit=DRAFT_ROWS),
        "draft_goes_hidden": max(0, len(goes) - DRAFT_ROWS),
        "draft_stays": [dict(row, pinned=row["id"] in pinned_live)
                        for row in message_rows(session, stays, limit=DRAFT_ROWS)],
        "draft_stays_hidden": max(0, len(stays) - DRAFT_ROWS),
        "draft_ops": summary_diff.word_diff(current, text) if draft["summary"] else [],
        "draft_lost": run.draft.get("lost") or [],
        "draft_lost_count": run.draft.get("lost_count") or 0,
        "draft_compactor": ((run.draft.get("planned") or {}).get("result") or {}).get("compactor", ""),
        "draft_moved": session.state_version != run.state_version,
        "draft_pins_changed": fingerprint(services.pins_of(session).to_dict()) != run.draft.get("pins_fingerprint"),
    }


def review_context(session: AgentSession) -> dict[str, Any]:
    return {**pins_context(session), **draft_context(session)}


def pin_state(session: AgentSession, message: SessionMessage) -> dict[str, Any]:
    """For a page about one message: can it be pinned, and is it."""
    return {"pin_message": message, "pin_pinned": message.message_id in services.pins_of(session).message_ids}


def why_pin(session: AgentSession, result: SearchResult | None) -> dict[str, Any] | None:
    """The action under "why was X lost?": pin the message the story is about while it is
    live (so the next compaction keeps it), and the searched string as a fact in any case."""
    if result is None or not result.messages:
        return None
    hit = story_hit(result)
    message = hit.message if hit is not None and hit.message.is_live else None
    pins = services.pins_of(session)
    return {"message": message, "message_pinned": message is not None and message.message_id in pins.message_ids,
            "fact": result.query.strip(), "fact_pinned": " ".join(result.query.split()) in pins.facts}
