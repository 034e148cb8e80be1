"""Import a recorded transcript from the browser, then watch it replay.

The upload is read and checked in the request (an unknown format or bad JSON
is answered at once, with the line and column); the replay runs as a
background job and the progress page polls its numbers every second.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods

from contextlab.dashboard.views.common import AuthenticatedHttpRequest, session_for_user
from contextlab.engine.core.errors import ContextLabError
from contextlab.sessions import services
from contextlab.sessions.models import AgentProfile, AgentSession, CompactionRun


def _form_context(request: AuthenticatedHttpRequest, **extra: Any) -> dict[str, Any]:
    return {"profiles": AgentProfile.objects.filter(owner=request.user),
            "max_upload_bytes": int(settings.CONTEXTLAB_MAX_UPLOAD_BYTES), **extra}


@require_http_methods(["GET", "POST"])
@login_required
def import_start(request: AuthenticatedHttpRequest) -> HttpResponse:
    if request.method == "GET":
        return render(request, "dashboard/import.html", _form_context(request))
    upload = request.FILES.get("file")
    title = request.POST.get("title", "").strip()
    raw_profile = request.POST.get("profile", "")
    if upload is None:
        return render(request, "dashboard/import.html",
                      _form_context(request, error="choose a transcript file to upload", title=title), status=400)
    profile = None
    if raw_profile.isdigit():
        profile = AgentProfile.objects.filter(pk=int(raw_profile), owner=request.user).first()
    try:
        session, run = services.transcript_import_enqueue(owner=request.user, upload=upload, profile=profile,
                                                          title=title)
    except ContextLabError as exc:
        return render(request, "dashboard/import.html", _form_context(
            request, error=exc.message, kind=type(exc).__name__, file_name=upload.name, title=title,
            profile_id=profile.pk if profile else None), status=400)
    if run is None:  # a session bundle: restored at once
        return redirect(session.get_absolute_url())
    return redirect("cl-import-progress", session_id=session.pk)


def _progress(session: AgentSession) -> dict[str, Any]:
    source = session.source or {}
    total = int(source.get("messages") or 0)
    run = session.compaction_runs.filter(trigger="import").order_by("-created").first()
    done = session.messages_count
    return {
        "session": session, "run": run, "total": total, "done": done,
        "percent": min(100, round(100 * done / total)) if total else 0,
        "finished": session.status != AgentSession.Status.IMPORTING,
        "failed": bool(source.get("error")) or (run is not None and run.status == CompactionRun.Status.FAILED),
        "error": source.get("error") or (run.error if run else ""),
    }


@require_GET
@login_required
def import_progress(request: AuthenticatedHttpRequest, session_id: UUID) -> HttpResponse:
    session = session_for_user(request, session_id)
    context = _progress(session)
    if request.htmx:
        response = render(request, "dashboard/import_progress.html#progress", context)
        if context["finished"] and not context["failed"]:
            # Done: on to the replayed session.
            response["HX-Redirect"] = reverse("cl-session-detail", args=[session.pk])
        return response
    return render(request, "dashboard/import_progress.html", context)
