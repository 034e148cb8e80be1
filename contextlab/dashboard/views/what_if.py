"""The profile page's what-if (the edited knobs replayed on one of the owner's sessions) and its history."""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_POST

from contextlab.dashboard.forms import ProfileForm
from contextlab.dashboard.views.common import AuthenticatedHttpRequest
from contextlab.engine.core.errors import InvalidProfile
from contextlab.sessions import services
from contextlab.sessions.models import AgentProfile, AgentSession, ProfileVersion, WhatIfRun
from contextlab.sessions.services.what_if import max_turns

WHAT_IF = "dashboard/_what_if.html"
SESSIONS_OFFERED = 100
CHART_WIDTH, CHART_HEIGHT, CHART_PAD = 640, 160, 4


def _profile(request: AuthenticatedHttpRequest, profile_id: int) -> AgentProfile:
    profile = AgentProfile.objects.filter(pk=profile_id, owner=request.user).first()
    if profile is None:
        raise Http404("No such profile")
    return profile


def what_if_sessions(request: AuthenticatedHttpRequest, profile: AgentProfile) -> list[AgentSession]:
    """The sessions offered for a what-if: the owner's with turns, this profile's first, newest first."""
    sessions = list(AgentSession.objects.filter(owner=request.user, turns_count__gt=0)
                    .select_related("profile").order_by("-last_activity")[:SESSIONS_OFFERED])
    return sorted(sessions, key=lambda s: s.profile_id != profile.pk)


def what_if_context(request: AuthenticatedHttpRequest, profile: AgentProfile) -> dict[str, Any]:
    """What the profile page needs for its what-if and history sections."""
    return {"what_if_sessions": what_if_sessions(request, profile),
            "what_if_max_turns": max_turns(),
            "versions": list(profile.versions.select_related("changed_by")[:50])}


def chart(result: dict[str, Any]) -> dict[str, Any]:
    """The tokens per turn of both runs as SVG polylines, with the two thresholds and the compactions."""
    turns = result.get("turns") or []
    if not turns:
        return {}
    top = max([*(t["actual"] or 0 for t in turns), *(t["what_if"] for t in turns),
               *result["window"].values()]) or 1
    last = max(len(turns) - 1, 1)

    def x(index: int) -> float:
        return round(CHART_PAD + index * (CHART_WIDTH - 2 * CHART_PAD) / last, 1)

    def y(tokens: int) -> float:
        return round(CHART_HEIGHT - CHART_PAD - tokens * (CHART_HEIGHT - 2 * CHART_PAD) / top, 1)

    index = {t["number"]: i for i, t in enumerate(turns)}
    return {
        "width": CHART_WIDTH, "height": CHART_HEIGHT,
        "actual": " ".join(f"{x(i)},{y(t['actual'])}" for i, t in enumerate(turns) if t["actual"] is not None),
        "what_if": " ".join(f"{x(i)},{y(t['what_if'])}" for i, t in enumerate(turns)),
        "threshold_actual": y(result["threshold"]["actual"]), "threshold_what_if": y(result["threshold"]["what_if"]),
        "marks_actual": [x(index[n]) for n in result["actual"]["compaction_turns"] if n in index],
        "marks_what_if": [x(index[n]) for n in result["what_if"]["compaction_turns"] if n in index],
    }


def _render(request: AuthenticatedHttpRequest, profile: AgentProfile, run: WhatIfRun | None,
            error: str = "") -> HttpResponse:
    context = {"profile": profile, "run": run, "what_if_error": error,
               "stalled": run is not None and services.whatif_stalled(run),
               "chart": chart(run.result) if run is not None and run.result else {}}
    return render(request, f"{WHAT_IF}#what-if-result", context)


@require_POST
@login_required
def profile_what_if(request: AuthenticatedHttpRequest, profile_id: int) -> HttpResponse:
    """Start a what-if of the form's values (saved or not) on the chosen session."""
    profile = _profile(request, profile_id)
    raw = request.POST.get("what_if_session", "")
    session = AgentSession.objects.filter(pk=raw, owner=request.user).first() if _is_uuid(raw) else None
    if session is None:
        return _render(request, profile, None, "Choose one of your sessions first.")
    # A fresh copy: the form writes the typed values onto its instance, which is never saved here.
    form = ProfileForm(request.POST, instance=AgentProfile.objects.get(pk=profile.pk), owner=request.user)
    if not form.is_valid():
        return _render(request, profile, None, "Fix the fields marked in the form first: a what-if runs the "
                                               "values the form would save.")
    try:
        run = services.whatif_start(profile=profile, session=session, values=form.instance.recorded_values(),
                                    by=request.user)
    except InvalidProfile as exc:
        return _render(request, profile, None, exc.message)
    return _render(request, profile, run)


@require_GET
@login_required
def profile_what_if_run(request: AuthenticatedHttpRequest, profile_id: int, run_id: int) -> HttpResponse:
    """A what-if's progress while it runs (the fragment polls itself), its comparison once done."""
    profile = _profile(request, profile_id)
    run = WhatIfRun.objects.filter(pk=run_id, profile=profile).select_related("session").first()
    if run is None:
        raise Http404("No such what-if")
    return _render(request, profile, run)


@require_GET
@login_required
def profile_version(request: AuthenticatedHttpRequest, profile_id: int, number: int) -> HttpResponse:
    profile = _profile(request, profile_id)
    version = ProfileVersion.objects.filter(profile=profile, number=number).select_related("changed_by").first()
    if version is None:
        raise Http404("No such version")
    changed = {c["field"] for c in version.changes}
    return render(request, "dashboard/profile_version.html", {
        "profile": profile, "version": version,
        "values": [{"field": k, "value": v, "changed": k in changed} for k, v in version.values.items()],
        "previous": number - 1 if number > 1 else None,
        "next": number + 1 if number < profile.version else None,
        "sessions_ran": profile.sessions.filter(turns__profile_version=number).distinct().count(),
    })


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True
