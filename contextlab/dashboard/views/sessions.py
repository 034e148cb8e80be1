"""Server-rendered pages: the sessions list, a session (live), one turn, and the
session page's fragments (each one a partial of ``sessions/detail.html``)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Min, Q, Sum
from django.http import Http404, HttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.views.decorators.http import require_GET

from contextlab.dashboard import fragments, timetravel
from contextlab.dashboard.views.common import AuthenticatedHttpRequest, session_for_user, turn_param
from contextlab.sessions import services
from contextlab.sessions.models import AgentProfile, AgentSession

SESSIONS_PER_PAGE = 50
DETAIL = fragments.TEMPLATE


def _profile_filter(request: AuthenticatedHttpRequest) -> int | None:
    raw = request.GET.get("profile", "")
    return int(raw) if raw.isdigit() else None


@require_GET
@login_required
def sessions_list(request: AuthenticatedHttpRequest) -> HttpResponse:
    profile_id = _profile_filter(request)
    failed = request.GET.get("failed") == "1"
    qs = (AgentSession.objects.filter(owner=request.user).listed(profile_id=profile_id, failed=failed)
          .annotate(lost_at_compaction=Sum("summary_versions__lost_count"),
                    # The "N lost" link opens the version that lost them first, not the newest.
                    first_loss_version=Min("summary_versions__version",
                                           filter=Q(summary_versions__lost_count__gt=0)))
          # A grouped query drops the model's ordering; the list is newest activity first.
          .order_by("-last_activity", "pk"))
    page = Paginator(qs, SESSIONS_PER_PAGE).get_page(request.GET.get("page"))
    template = "sessions/list.html"
    # The filter form and the pager swap only the table.
    if request.htmx:
        template += "#session-table"
    # The demo's story for a first visit, as the demo loader found it (dashboard/demo_story.py).
    demo = (AgentSession.objects.filter(owner=request.user, source__has_key="demo_story")
            .order_by("created").first())
    return render(request, template, {
        "page": page,
        "demo": demo,
        "demo_story": (demo.source or {}).get("demo_story") if demo else None,
        "profiles": AgentProfile.objects.filter(owner=request.user),
        "profile_id": profile_id,
        "failed": failed,
    })


@require_GET
@login_required
def session_detail(request: AuthenticatedHttpRequest, session_id: UUID) -> HttpResponse:
    session = session_for_user(request, session_id)
    context = fragments.page_context(session)
    raw = request.GET.get("turn", "")
    if raw.isdigit():
        # A link to the session at one turn (time travel): every panel pinned there.
        turn, _ = turn_param(session, raw)
        assert turn is not None
        context.update(timetravel.at_context(session, turn))
    return render(request, DETAIL, context)


def _fragment(request: AuthenticatedHttpRequest, name: str, context: dict[str, Any]) -> HttpResponse:
    return render(request, f"{DETAIL}#{name}", {"oob": False, **context})


@require_GET
@login_required
def session_turns(request: AuthenticatedHttpRequest, session_id: UUID) -> HttpResponse:
    """The turn selector's page (``?page=&outcome=``), or the turns after a cursor (``?after=N``)."""
    session = session_for_user(request, session_id)
    after = request.GET.get("after", "")
    if after.isdigit():
        # Catch-up for a page that knows turns up to N: the same rows, newer only.
        rows = fragments.turns_after(session, int(after))
        html = render_to_string(f"{DETAIL}#turn-rows", {"session": session, "turn_rows": rows}, request=request)
        response = HttpResponse(html)
        response["X-Last-Turn"] = str(rows[0].number if rows else after)
        return response
    return _fragment(request, "turns", {"session": session, **fragments.turns_context(
        session, page=request.GET.get("page"), outcome=request.GET.get("outcome", ""))})


@require_GET
@login_required
def session_inspect(request: AuthenticatedHttpRequest, session_id: UUID) -> HttpResponse:
    """The decision flow of one turn, with its LLM view swapped in beside it."""
    session = session_for_user(request, session_id)
    turn, newest = turn_param(session, request.GET.get("turn"))
    live = newest and request.GET.get("turn", "latest") == "latest"
    context = {"session": session, **fragments.flow_context(session, turn, live=live),
               **fragments.llm_context(session, turn, live=live)}
    flow = render_to_string(f"{DETAIL}#flow", {"oob": False, **context}, request=request)
    llm = render_to_string(f"{DETAIL}#llm", {"oob": False, **context}, request=request)
    # The LLM view goes into its own panel, out of band.
    return HttpResponse(flow + f'\n<div id="llm-panel" hx-swap-oob="innerHTML">{llm}</div>')


@require_GET
@login_required
def session_llm(request: AuthenticatedHttpRequest, session_id: UUID) -> HttpResponse:
    session = session_for_user(request, session_id)
    turn, newest = turn_param(session, request.GET.get("turn"))
    live = newest and request.GET.get("live") == "1"
    return _fragment(request, "llm", {"session": session, **fragments.llm_context(
        session, turn, page=request.GET.get("page"), live=live)})


@require_GET
@login_required
def session_messages(request: AuthenticatedHttpRequest, session_id: UUID) -> HttpResponse:
    session = session_for_user(request, session_id)
    page = request.GET.get("page")
    if request.GET.get("turn", "").isdigit():
        turn, _ = turn_param(session, request.GET["turn"], payload=False)
        assert turn is not None
        return _fragment(request, "fate", {"session": session, **timetravel.fate_at(session, turn, page=page)})
    return _fragment(request, "fate", {"session": session, **fragments.fate_context(session, page=page)})


@require_GET
@login_required
def session_ledger(request: AuthenticatedHttpRequest, session_id: UUID) -> HttpResponse:
    session = session_for_user(request, session_id)
    page = request.GET.get("page")
    if request.GET.get("turn", "").isdigit():
        turn, _ = turn_param(session, request.GET["turn"], payload=False)
        assert turn is not None
        return _fragment(request, "ledger", {"session": session, **timetravel.ledger_at(session, turn, page=page)})
    return _fragment(request, "ledger", {"session": session, **fragments.ledger_context(session, page=page)})


@require_GET
@login_required
def turn_detail(request: AuthenticatedHttpRequest, session_id: UUID, number: int) -> HttpResponse:
    session = session_for_user(request, session_id)
    turn = session.turns.filter(number=number).first()
    if turn is None:
        raise Http404("No such turn")
    # The turn that lost identifiers at compaction says so, with the way to the summary that lost them.
    fragments.with_losses(session, [turn])
    return render(request, "sessions/turn.html", {
        "session": session,
        "turn": turn,
        **fragments.gauge_context(session, turn, now=False),
        **fragments.flow_context(session, turn, live=False),
        **fragments.llm_context(session, turn, page=request.GET.get("page"), live=False),
        "previous": number - 1 if number > 1 else None,
        "next": number + 1 if number < session.turns_count else None,
    })


@require_GET
@login_required
def session_export(request: AuthenticatedHttpRequest, session_id: UUID) -> HttpResponse:
    session = session_for_user(request, session_id)
    response = HttpResponse(services.session_export(session=session), content_type="application/zip")
    response["Content-Disposition"] = f'attachment; filename="contextlab-session-{session.id}.zip"'
    return response
