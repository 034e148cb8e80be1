"""The insight pages: memory, working memory and operations, stale reads, policy
comparison and retrieval. Owner only: another user's session or profile is a
404, exactly like a missing one. Every text shown comes from the agent, its
tools or its user and is escaped by the templates."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils.dateparse import parse_datetime
from django.views.decorators.http import require_GET, require_POST

from contextlab.dashboard.views.common import AuthenticatedHttpRequest, session_for_user
from contextlab.engine.core.errors import ContextLabError
from contextlab.insights import services
from contextlab.insights.charts import token_chart
from contextlab.insights.forms import CompareForm, OperationsFilter, RecallForm
from contextlab.sessions.models import AgentProfile, AgentSession

OPERATIONS_PER_PAGE = 50
STALE_PER_PAGE = 50
NOTES_PER_PAGE = 7
CHANGES_PER_PAGE = 5
PLANS_PER_PAGE = 3
SESSIONS_PER_PAGE = 25


def _profile_for_user(request: AuthenticatedHttpRequest, profile_id: int) -> AgentProfile:
    profile = AgentProfile.objects.filter(pk=profile_id, owner=request.user).first()
    if profile is None:
        raise Http404("No such profile")
    return profile


def _base(session: AgentSession, tab: str) -> dict[str, Any]:
    return {"session": session, "tab": tab, "nav": "sessions"}


# -- memory ----------------------------------------------------------------------------------


def _memory_context(request: AuthenticatedHttpRequest, session: AgentSession) -> dict[str, Any]:
    snapshot = services.memory_snapshot(session.workspace)
    return {**_base(session, "memory"), "snapshot": snapshot,
            "notes_page": Paginator(snapshot.notes, NOTES_PER_PAGE).get_page(request.GET.get("notes")),
            "changes_page": Paginator(snapshot.changes, CHANGES_PER_PAGE).get_page(request.GET.get("changes")),
            "timezone": session.profile.timezone, "memory_days": settings.CONTEXTLAB_MEMORY_DAYS}


@require_GET
@login_required
def session_memory(request: AuthenticatedHttpRequest, session_id: UUID) -> HttpResponse:
    session = session_for_user(request, session_id)
    context = _memory_context(request, session)
    context["just_consolidated"] = request.GET.get("consolidated", "")
    return render(request, "insights/memory.html", context)


@require_POST
@login_required
def session_memory_consolidate(request: AuthenticatedHttpRequest, session_id: UUID) -> HttpResponse:
    session = session_for_user(request, session_id)
    try:
        done = services.memory_consolidate_session(session=session)
    except ContextLabError as exc:
        if request.htmx:
            return render(request, "insights/_consolidation.html", {"error": exc.message}, status=409)
        return render(request, "insights/memory.html",
                      {**_memory_context(request, session), "consolidate_error": exc.message}, status=409)
    if request.htmx:
        # The result panel, and the rest of the page refreshed out of band.
        return render(request, "insights/_consolidation.html",
                      {**_memory_context(request, session), "done": done, "oob": True})
    # Without htmx: post/redirect/get; the newest change is at the top of the history.
    url = reverse("cl-insights-memory", args=[session.id])
    return HttpResponseRedirect(f"{url}?consolidated={'changed' if done.result.diff else 'unchanged'}")


@require_GET
@login_required
def profile_memory(request: AuthenticatedHttpRequest, profile_id: int) -> HttpResponse:
    profile = _profile_for_user(request, profile_id)
    sessions = AgentSession.objects.filter(owner=request.user, profile=profile).select_related("profile")
    page = Paginator(sessions, SESSIONS_PER_PAGE).get_page(request.GET.get("page"))
    agent_root = services.agent_workspace(profile)
    rows = services.session_memory_rows(page.object_list)
    return render(request, "insights/profile_memory.html", {
        "profile": profile, "nav": "profiles", "page": page, "rows": rows,
        "merged": services.merged_memory(rows),
        "agent": services.memory_snapshot(agent_root) if agent_root.is_dir() else None,
        "memory_days": settings.CONTEXTLAB_MEMORY_DAYS,
    })


@require_POST
@login_required
def profile_memory_consolidate(request: AuthenticatedHttpRequest, profile_id: int) -> HttpResponse:
    profile = _profile_for_user(request, profile_id)
    at, changed = services.memory_consolidate_profile(profile=profile)
    changed = [c for c in changed if c.session.owner_id == request.user.pk]
    return render(request, "insights/_profile_consolidation.html" if request.htmx else "insights/profile_done.html",
                  {"profile": profile, "nav": "profiles", "at": at, "changed": changed})


# -- working memory and operations ------------------------------------------------------------------


@require_GET
@login_required
def session_operations(request: AuthenticatedHttpRequest, session_id: UUID) -> HttpResponse:
    session = session_for_user(request, session_id)
    view = services.operations_for(session)
    form = OperationsFilter(request.GET)
    status = subtask = ""
    if form.is_valid():
        status, subtask = form.cleaned_data["status"], form.cleaned_data["subtask"]
    shown = services.filter_operations(view.operations, status=status, subtask=subtask)
    page = Paginator(shown, OPERATIONS_PER_PAGE).get_page(request.GET.get("page"))
    template = "insights/operations.html#operations-table" if request.htmx else "insights/operations.html"
    return render(request, template, {
        **_base(session, "operations"), "view": view, "form": form, "status": status, "subtask": subtask,
        "page": page, "shown": len(shown),
        "subtask_titles": sorted({op.subtask for op in view.operations if op.subtask}),
    })


# -- stale reads -----------------------------------------------------------------------------------


@require_GET
@login_required
def session_stale(request: AuthenticatedHttpRequest, session_id: UUID) -> HttpResponse:
    session = session_for_user(request, session_id)
    rows = services.stale_reads_for(session)
    paths: dict[str, int] = {}
    for row in rows:
        paths[row.path] = paths.get(row.path, 0) + 1
    return render(request, "insights/stale.html", {
        **_base(session, "stale"), "page": Paginator(rows, STALE_PER_PAGE).get_page(request.GET.get("page")),
        "total": len(rows), "live": sum(1 for r in rows if r.live),
        "paths": sorted(paths.items(), key=lambda item: (-item[1], item[0])),
    })


# -- policy comparison --------------------------------------------------------------------------------


def _comparison_context(session: AgentSession, data: dict[str, Any] | None) -> dict[str, Any]:
    if data is None:
        return {"comparison": None}
    policies = data.get("policies") or []
    window, threshold = int(data.get("window") or 0), int(data.get("threshold") or 0)
    lines = [(p["name"], p["label"], p["tokens"]) for p in policies]
    overview = token_chart(lines, window=window, threshold=threshold, width=1160, height=300)
    for policy in policies:
        actions = policy.get("actions") or {}
        # Compaction reports "summarized", eviction "summarize": one column for both.
        policy["counts"] = {"summarized": actions.get("summarized", 0) + actions.get("summarize", 0),
                            "externalized": actions.get("externalize", 0), "dropped": actions.get("drop", 0)}
        policy["chart"] = token_chart([(policy["name"], policy["label"], policy["tokens"])], window=window,
                                      threshold=threshold, width=380, height=130, compact=True)
    data["created_at"] = parse_datetime(str(data.get("created") or ""))
    return {"comparison": data, "overview": overview}


@require_GET
@login_required
def session_compare(request: AuthenticatedHttpRequest, session_id: UUID) -> HttpResponse:
    session = session_for_user(request, session_id)
    cached = services.compare_cached(session)
    plans_page = Paginator(services.eviction_turns(session), PLANS_PER_PAGE).get_page(request.GET.get("plans"))
    seqs = services.message_seqs(session) if plans_page.object_list else {}
    initial = {"window": cached.get("window_override")} if cached else {}
    return render(request, "insights/compare.html", {
        **_base(session, "compare"), **_comparison_context(session, cached),
        "form": CompareForm(initial=initial), "plans_page": plans_page,
        "plans": services.plan_views(plans_page.object_list, seqs),
        "max_messages": services.MAX_COMPARE_MESSAGES,
    })


@require_POST
@login_required
def session_compare_run(request: AuthenticatedHttpRequest, session_id: UUID) -> HttpResponse:
    session = session_for_user(request, session_id)
    form = CompareForm(request.POST)
    error = ""
    data: dict[str, Any] | None = None
    if form.is_valid():
        try:
            data = services.compare_run(session=session, window=form.cleaned_data["window"])
        except ContextLabError as exc:
            error = exc.message
    else:
        error = "; ".join(str(e) for errors in form.errors.values() for e in errors)
    status = 400 if error else 200
    if request.htmx:
        return render(request, "insights/compare.html#comparison",
                      {**_base(session, "compare"), **_comparison_context(session, data or services.compare_cached(session)),
                       "compare_error": error}, status=status)
    if error:
        return render(request, "insights/compare.html", {
            **_base(session, "compare"), **_comparison_context(session, services.compare_cached(session)),
            "form": form, "compare_error": error, "plans": [], "plans_page": None,
            "max_messages": services.MAX_COMPARE_MESSAGES}, status=status)
    return HttpResponseRedirect(reverse("cl-insights-compare", args=[session.id]))


# -- retrieval -------------------------------------------------------------------------------------


@require_GET
@login_required
def session_recall(request: AuthenticatedHttpRequest, session_id: UUID) -> HttpResponse:
    session = session_for_user(request, session_id)
    form = RecallForm(request.GET)
    query = ""
    rows: list[services.HitRow] = []
    if form.is_valid():
        query = form.cleaned_data["q"].strip()
        if query:
            hits = services.recall_search(session=session, query=query, limit=form.cleaned_data["limit"] or 20)
            rows = services.hit_rows(session, hits, query)
    return render(request, "insights/recall.html", {**_base(session, "recall"), "form": form, "query": query,
                                                    "rows": rows})
