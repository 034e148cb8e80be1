"""What every dashboard view needs: the typed request and owner-only lookups."""

from __future__ import annotations

from uuid import UUID

from django.contrib.auth.models import User
from django.http import Http404, HttpRequest
from django_htmx.middleware import HtmxDetails

from contextlab.sessions.models import AgentSession, Turn


class AuthenticatedHttpRequest(HttpRequest):
    user: User
    htmx: HtmxDetails


def session_for_user(request: AuthenticatedHttpRequest, session_id: UUID) -> AgentSession:
    # Another user's session is a 404, exactly like a missing one. The engine's
    # state (megabytes on a long session) is for the services, never a page.
    session = (AgentSession.objects.select_related("profile").defer("engine_state")
               .filter(pk=session_id, owner=request.user).first())
    if session is None:
        raise Http404("No such session")
    return session


def turn_param(session: AgentSession, raw: str | None, *, payload: bool = True) -> tuple[Turn | None, bool]:
    """The turn a request names (``?turn=N``; "latest" or nothing for the newest) and whether it is the newest."""
    qs = session.turns.all() if payload else session.turns.defer("payload")
    if raw and raw.isdigit():
        turn = qs.filter(number=int(raw)).first()
        if turn is None:
            raise Http404("No such turn")
        return turn, turn.number == session.turns_count
    return qs.order_by("-number").first(), True
