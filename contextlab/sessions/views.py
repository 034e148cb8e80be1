"""Server-rendered pages: the sessions list, a session, and one turn's trace."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET
from django_htmx.middleware import HtmxDetails

from contextlab.sessions import services
from contextlab.sessions.models import AgentProfile, AgentSession, Turn

SESSIONS_PER_PAGE = 50
TURNS_PER_PAGE = 25
MESSAGES_PER_PAGE = 50
LAYERS = (("system", "system prompt"), ("summary", "summary"), ("messages", "messages"),
          ("tool_results", "tool results"))


class AuthenticatedHttpRequest(HttpRequest):
    user: User
    htmx: HtmxDetails


def _get_session_for_user(request: AuthenticatedHttpRequest, session_id: UUID) -> AgentSession:
    # Another user's session is a 404, exactly like a missing one.
    session = AgentSession.objects.select_related("profile").filter(pk=session_id, owner=request.user).first()
    if session is None:
        raise Http404("No such session")
    return session


def _profile_filter(request: AuthenticatedHttpRequest) -> int | None:
    raw = request.GET.get("profile", "")
    return int(raw) if raw.isdigit() else None


@require_GET
@login_required
def sessions_list(request: AuthenticatedHttpRequest) -> HttpResponse:
    profile_id = _profile_filter(request)
    failed = request.GET.get("failed") == "1"
    qs = AgentSession.objects.filter(owner=request.user).listed(profile_id=profile_id, failed=failed)
    page = Paginator(qs, SESSIONS_PER_PAGE).get_page(request.GET.get("page"))
    template = "sessions/list.html"
    # The filter form and the pager swap only the table.
    if request.htmx:
        template += "#session-table"
    return render(request, template, {
        "page": page,
        "profiles": AgentProfile.objects.filter(owner=request.user),
        "profile_id": profile_id,
        "failed": failed,
    })


def _budget(session: AgentSession, turn: Turn | None) -> dict[str, Any]:
    """The token-budget bar: the latest payload split by layer, as shares of the window."""
    window = (turn.window if turn else 0) or session.tokens_window or 1
    threshold = (turn.threshold if turn else 0) or session.tokens_threshold
    tokens = turn.layer_tokens() if turn else {}
    segments = [
        {"key": key, "label": label, "tokens": tokens.get(key, 0),
         "percent": round(100 * tokens.get(key, 0) / window, 2)}
        for key, label in LAYERS
    ]
    total = tokens.get("total", 0)
    reserve = int((turn.trace.get("budget") or {}).get("reserve", 0)) if turn else 0
    return {
        "window": window,
        "threshold": threshold,
        "reserve": reserve,
        "total": total,
        "segments": segments,
        "threshold_percent": round(100 * threshold / window, 2),
        "over_threshold": bool(threshold) and total >= threshold,
        "over_window": total > window,
    }


@require_GET
@login_required
def session_detail(request: AuthenticatedHttpRequest, session_id: UUID) -> HttpResponse:
    session = _get_session_for_user(request, session_id)
    latest = session.latest_turn()
    turns = Paginator(session.turns.order_by("-number").only(
        "number", "trigger", "outcome", "used_tokens", "threshold", "payload_tokens", "compacted_count",
        "duration_ms", "summary_version", "created", "session_id"), TURNS_PER_PAGE).get_page(request.GET.get("tpage"))
    # The ingested content can be megabytes and the page shows the current one.
    messages = Paginator(session.messages.order_by("seq").defer("content", "fate"),
                         MESSAGES_PER_PAGE).get_page(request.GET.get("page"))
    template = "sessions/detail.html"
    if request.htmx and request.htmx.target in ("messages", "turns"):
        template += f"#{request.htmx.target}"
    return render(request, template, {
        "session": session,
        "latest": latest,
        "budget": _budget(session, latest),
        "turns": turns,
        "messages": messages,
    })


@require_GET
@login_required
def turn_detail(request: AuthenticatedHttpRequest, session_id: UUID, number: int) -> HttpResponse:
    session = _get_session_for_user(request, session_id)
    turn = session.turns.filter(number=number).first()
    if turn is None:
        raise Http404("No such turn")
    return render(request, "sessions/turn.html", {
        "session": session,
        "turn": turn,
        "budget": _budget(session, turn),
        "previous": number - 1 if number > 1 else None,
        "next": number + 1 if number < session.turns_count else None,
    })


@require_GET
@login_required
def session_export(request: AuthenticatedHttpRequest, session_id: UUID) -> HttpResponse:
    session = _get_session_for_user(request, session_id)
    response = HttpResponse(services.session_export(session=session), content_type="application/zip")
    response["Content-Disposition"] = f'attachment; filename="contextlab-session-{session.id}.zip"'
    return response
