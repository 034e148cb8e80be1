from __future__ import annotations

from uuid import UUID

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from contextlab.dashboard import review
from contextlab.dashboard.search import MAX_QUERY, search_session
from contextlab.dashboard.views.common import AuthenticatedHttpRequest, session_for_user
from contextlab.dashboard.views.reinject import reinject_context
from contextlab.dashboard.why import why_lost

HITS_PER_PAGE = 30


@require_GET
@login_required
def session_search(request: AuthenticatedHttpRequest, session_id: UUID) -> HttpResponse:
    session = session_for_user(request, session_id)
    query = request.GET.get("q", "")[:MAX_QUERY]
    result = search_session(session, query) if query.strip() else None
    hits = Paginator(result.messages if result else [], HITS_PER_PAGE).get_page(request.GET.get("page"))
    template = "sessions/search.html"
    if request.htmx and request.htmx.target == "search-results":
        template += "#search-results"
    return render(request, template, {"session": session, "query": query, "result": result, "hits": hits,
                                      "why": why_lost(session, result), "why_pin": review.why_pin(session, result),
                                      **reinject_context(session, result)})
