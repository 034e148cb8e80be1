"""``POST /api/v1/sessions/<id>/recall``: search what the session keeps outside its
live context and, on request, put the hits back into it as a recollection."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.http import HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from contextlab.api.decorators import ApiError, ApiRequest, authorize, json_body, require_methods
from contextlab.api.openapi import RECALL
from contextlab.insights import services
from contextlab.sessions.models import AgentSession

DEFAULT_LIMIT = 10


def _session(request: ApiRequest, session_id: UUID) -> AgentSession:
    # Someone else's session answers exactly like a missing one.
    session = AgentSession.objects.select_related("profile").filter(pk=session_id, owner=request.user).first()
    if session is None:
        raise ApiError(404, f"you have no session {session_id}", "id")
    return session


def _recall_body(body: dict[str, Any]) -> tuple[str, int, bool]:
    query = body.get("query")
    if not isinstance(query, str) or not query.strip():
        raise ApiError(400, "query is required: the text to look for (a path, an id, an error, a phrase)", "query")
    if len(query) > services.MAX_QUERY_CHARS:
        raise ApiError(400, f"query is longer than {services.MAX_QUERY_CHARS:,} characters", "query")
    limit = body.get("limit", DEFAULT_LIMIT)
    # bool is an int in Python; `"limit": true` is a mistake, not 1.
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= services.MAX_RECALL_LIMIT:
        raise ApiError(400, f"limit must be a whole number from 1 to {services.MAX_RECALL_LIMIT}", "limit")
    inject = body.get("inject", False)
    if not isinstance(inject, bool):
        raise ApiError(400, "inject must be true or false", "inject")
    return query.strip(), limit, inject


@csrf_exempt
@require_methods("POST")
@authorize
def session_recall(request: ApiRequest, session_id: UUID) -> HttpResponse:
    session = _session(request, session_id)
    query, limit, inject = _recall_body(json_body(request, RECALL))
    hits = services.recall_search(session=session, query=query, limit=limit)
    rows = services.hit_rows(session, hits)
    data: dict[str, Any] = {"query": query, "hits": [{**row.hit.to_dict(), "seq": row.seq} for row in rows],
                            "injected": None}
    if not inject:
        return JsonResponse(data)
    row = services.recall_inject(session=session, hits=hits, query=query)
    session.refresh_from_db()
    text = next((b.get("text", "") for b in row.content if isinstance(b, dict) and b.get("type") == "text"), "")
    data["injected"] = {"message": row.to_dict(), "text": text}
    data["session"] = session.to_dict()
    return JsonResponse(data, status=201)
