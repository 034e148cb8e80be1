"""Manual compaction from the session page: preview the split, then start it, or review it first.

The review: pin messages and facts, dry run with the profile's compactor (a
background run), then accept or discard its draft; a running compaction or
dry run can be cancelled.

The run is a background job (``services.compaction_start`` → ``jobs.enqueue``);
its progress and result reach the page over the session's websocket, where the
compaction panel is one of the pushed fragments.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from contextlab.dashboard import fragments
from contextlab.dashboard.views.common import AuthenticatedHttpRequest, session_for_user
from contextlab.engine.core.errors import ContextLabError
from contextlab.lib import textsafe
from contextlab.lib.blocks import first_text
from contextlab.sessions import services
from contextlab.sessions.models import AgentSession, CompactionRun, SessionMessage

PREVIEW_ENDS = 4  # messages shown at each end of the "to compact" list


def _rows(session_id: UUID, ids: list[str]) -> list[dict[str, Any]]:
    found = {m.message_id: m for m in SessionMessage.objects.filter(session_id=session_id, message_id__in=ids).order_by()
             .only("seq", "message_id", "role", "tokens", "current_content", "session_id")}
    rows = []
    for message_id in ids:
        message = found.get(message_id)
        rows.append({"message": message, "id": message_id,
                     "excerpt": textsafe.excerpt(first_text(message.current_content), 140)
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


def _panel(request: AuthenticatedHttpRequest, session: AgentSession, *, error: str | None = None,
           status: int = 200) -> HttpResponse:
    """The compaction panel (with the pins and the review), as htmx swaps it in."""
    session.refresh_from_db()
    context = {"session": session, "oob": False, "compaction_error": error, **fragments.compaction_context(session)}
    return render(request, f"{fragments.TEMPLATE}#compaction", context, status=status)


def _back(request: AuthenticatedHttpRequest, session: AgentSession) -> str:
    """Where a plain form post goes back to: a page of this session only, never a URL from the form as is."""
    target = request.POST.get("next", "")
    base = session.get_absolute_url()
    if target.startswith(base) and "//" not in target and "\\" not in target:
        return target
    return base + "#compaction-card"


def _run_for(session: AgentSession, run_id: int) -> CompactionRun:
    run = CompactionRun.objects.select_related("session").filter(pk=run_id, session=session).first()
    if run is None:
        raise Http404("No such run")
    return run


@require_POST
@login_required
def compaction_dry_run(request: AuthenticatedHttpRequest, session_id: UUID) -> HttpResponse:
    session = session_for_user(request, session_id)
    error, status = fragments.compaction_blocker(session), 202
    if error is None:
        try:
            services.dry_run_start(session=session, instruction=request.POST.get("instruction", "").strip() or None,
                                   requested_by=request.user)
        except (services.RunInProgress, services.SessionUnavailable) as exc:
            error = exc.message
        except ContextLabError as exc:
            error, status = exc.message, 400
    if error is not None:
        status = 409 if status == 202 else status
    if not request.htmx and error is None:
        return redirect(session.get_absolute_url() + "#compaction-card")
    return _panel(request, session, error=error, status=status)


@require_POST
@login_required
def compaction_review(request: AuthenticatedHttpRequest, session_id: UUID, run_id: int, action: str) -> HttpResponse:
    """Accept or discard a draft, or cancel a running compaction."""
    session = session_for_user(request, session_id)
    run = _run_for(session, run_id)
    error, status = None, 200
    try:
        if action == "accept":
            services.draft_accept(run=run)
        elif action == "discard":
            services.draft_discard(run=run)
        elif action == "cancel":
            services.run_cancel(run=run)
        else:
            raise Http404("No such action")
    except services.DraftStale as exc:
        error, status = exc.message, 409
    except services.DraftNotOpen as exc:
        error, status = exc.message, 409
    except ContextLabError as exc:
        error, status = exc.message, 400
    if not request.htmx and error is None:
        return redirect(session.get_absolute_url() + "#compaction-card")
    return _panel(request, session, error=error, status=status)


PIN_ACTIONS = ("pin_message", "unpin_message", "pin_fact", "unpin_fact")


@require_POST
@login_required
def session_pins(request: AuthenticatedHttpRequest, session_id: UUID) -> HttpResponse:
    """Pin or unpin a message (by ``message_id`` or ``seq``) or a fact, for the coming compactions."""
    session = session_for_user(request, session_id)
    action = request.POST.get("action", "")
    error, status = None, 200
    message_id = request.POST.get("message_id", "")
    seq = request.POST.get("seq", "")
    if not message_id and seq.isdigit():
        message_id = (SessionMessage.objects.filter(session=session, seq=int(seq))
                      .values_list("message_id", flat=True).first() or "")
    try:
        if action == "pin_message":
            services.pin_message(session=session, message_id=message_id)
        elif action == "unpin_message":
            services.unpin_message(session=session, message_id=message_id)
        elif action == "pin_fact":
            services.pin_fact(session=session, fact=request.POST.get("fact", ""))
        elif action == "unpin_fact":
            services.unpin_fact(session=session, fact=request.POST.get("fact", ""))
        else:
            error, status = f"unknown action; one of {', '.join(PIN_ACTIONS)}", 400
    except ContextLabError as exc:
        error, status = exc.message, 400
    if not request.htmx:
        if error is not None:
            return HttpResponse(error, status=status, content_type="text/plain; charset=utf-8")
        return redirect(_back(request, session))
    return _panel(request, session, error=error, status=status)
