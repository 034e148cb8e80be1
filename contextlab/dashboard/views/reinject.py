"""The "re-inject the original" action of the search's why-sentence."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from contextlab.dashboard.search import SearchResult
from contextlab.dashboard.views.common import AuthenticatedHttpRequest, session_for_user
from contextlab.engine.core.errors import ContextLabError
from contextlab.sessions import services
from contextlab.sessions.models import AgentSession, SessionMessage
from contextlab.sessions.services.reinject import reinjectable

TEMPLATE = "sessions/_reinject.html"


def reinject_context(session: AgentSession, result: SearchResult | None) -> dict[str, Any]:
    """The message the why-sentence tells about, when its original can go back into the context."""
    if result is None:
        return {}
    gone = [hit for hit in result.messages if not (hit.message.is_live and hit.in_current)]
    if not gone or not reinjectable(gone[0].message) or session.status != AgentSession.Status.ACTIVE:
        return {}
    return {"reinject_message": gone[0].message}


@require_POST
@login_required
def message_reinject(request: AuthenticatedHttpRequest, session_id: UUID, seq: int) -> HttpResponse:
    session = session_for_user(request, session_id)
    source = SessionMessage.objects.filter(session=session, seq=seq).first()
    added: SessionMessage | None = None
    error = ""
    try:
        added = services.message_reinject(session=session, seq=seq, by=request.user)
    except ContextLabError as exc:
        error = exc.message
    if not request.htmx:
        return redirect("cl-message-detail", session.id, added.seq if added else seq)
    return render(request, TEMPLATE, {"session": session, "reinject_message": source, "reinjected": added,
                                      "reinject_error": error})
