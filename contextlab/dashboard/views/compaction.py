"""Manual compaction from the session page: preview the split, then start it.

The run is a background job (``services.compaction_start`` → ``jobs.enqueue``);
its progress and result reach the page over the session's websocket, where the
compaction panel is one of the pushed fragments.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from contextlab.dashboard import fragments
from contextlab.dashboard.views.common import AuthenticatedHttpRequest, session_for_user
from contextlab.engine.errors import ContextLabError
from contextlab.lib import textsafe
from contextlab.sessions import services
from contextlab.sessions.models import SessionMessage

PREVIEW_ENDS = 4  # messages shown at each end of the "to compact" list


def _rows(session_id: UUID, ids: list[str]) -> list[dict[str, Any]]:
    found = {m.message_id: m for m in SessionMessage.objects.filter(session_id=session_id, message_id__in=ids).order_by()
             .only("seq", "message_id", "role", "tokens", "current_content", "session_id")}
    rows = []
    for message_id in ids:
        message = found.get(message_id)
        rows.append({"message": message, "id": message_id,
                     "excerpt": textsafe.excerpt(fragments.first_text(message.current_content), 140)
                     if message else ""})
    return rows


@require_GET
@login_required
def compaction_preview(request: AuthenticatedHttpRequest, session_id: UUID) -> HttpResponse:
    session = session_for_user(request, session_id)
    try:
        preview = services.compaction_preview(session=session)
    except ContextLabError as exc:
        return render(request, f"{fragments.TEMPLATE}#compaction-preview", {"session": session, "error": exc.message})
    compact_ids: list[str] = list(preview["compact_ids"])
    keep_ids: list[str] = list(preview["keep_ids"])
    pinned = set(preview["pinned_ids"])
    # Both ends of a long list say where the cut lands; the middle is a count.
    shown = compact_ids if len(compact_ids) <= 2 * PREVIEW_ENDS else [
        *compact_ids[:PREVIEW_ENDS], *compact_ids[-PREVIEW_ENDS:]]
    rows = _rows(session.pk, shown + keep_ids[: 2 * PREVIEW_ENDS])
    return render(request, f"{fragments.TEMPLATE}#compaction-preview", {
        "session": session, "preview": preview,
        "compact_rows": rows[: len(shown)], "compact_hidden": len(compact_ids) - len(shown),
        "gap_after": PREVIEW_ENDS if len(compact_ids) > 2 * PREVIEW_ENDS else None,
        "keep_rows": [dict(row, pinned=row["id"] in pinned) for row in rows[len(shown):]],
        "keep_hidden": max(0, len(keep_ids) - 2 * PREVIEW_ENDS),
    })


@require_POST
@login_required
def compaction_start(request: AuthenticatedHttpRequest, session_id: UUID) -> HttpResponse:
    session = session_for_user(request, session_id)
    instruction = request.POST.get("instruction", "").strip() or None
    status = 202
    error = fragments.compaction_blocker(session)
    if error is not None:
        # Refused before a run exists: an empty manual turn would only say
        # "over the threshold" about a compaction that compacted nothing.
        status = 409
    try:
        if error is None:
            services.compaction_start(session=session, instruction=instruction, requested_by=request.user)
    except services.RunInProgress as exc:
        status, error = 409, exc.message
    except services.SessionUnavailable as exc:
        status, error = 409, exc.message
    except ContextLabError as exc:
        status, error = 400, exc.message
    if not request.htmx and error is None:
        # A plain form post (no JavaScript): back to the page, which shows the run.
        return redirect(session.get_absolute_url() + "#compaction-card")
    session.refresh_from_db()
    context = {"session": session, "oob": False, "compaction_error": error, **fragments.compaction_context(session)}
    return render(request, f"{fragments.TEMPLATE}#compaction", context, status=status)
