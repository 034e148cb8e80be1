"""Agent profiles: list, create, edit, and the live preview of derived numbers."""

from __future__ import annotations

import contextlib
from typing import Any

from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.db.models import Count
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from contextlab.dashboard.announce import profile_announce
from contextlab.dashboard.forms import ProfileForm, derived_numbers
from contextlab.dashboard.views.common import AuthenticatedHttpRequest
from contextlab.dashboard.views.what_if import what_if_context
from contextlab.engine.core.errors import InvalidProfile
from contextlab.sessions.models import AgentProfile

FORM = "dashboard/profile_form.html"


@require_GET
@login_required
def profiles_list(request: AuthenticatedHttpRequest) -> HttpResponse:
    profiles = AgentProfile.objects.filter(owner=request.user).annotate(session_count=Count("sessions"))
    return render(request, "dashboard/profiles.html", {"profiles": profiles})


def _preview(form: ProfileForm) -> dict[str, Any]:
    """Derived numbers and warnings for the form as typed (valid or not)."""
    numbers = derived_numbers(form.data) if form.is_bound else derived_numbers(
        {k: form.initial.get(k, form.fields[k].initial) for k in ("max_input_length", "compact_ratio",
                                                                   "reserve_ratio")})
    warnings: list[str] = []
    if form.is_bound and form.is_valid():
        with contextlib.suppress(InvalidProfile):
            warnings = form.instance.to_engine().warnings()
    if numbers and numbers["window"] > 0:
        scale = numbers["window"]
        numbers = {**numbers, "threshold_percent": round(100 * numbers["threshold"] / scale, 2),
                   "reserve_percent": round(100 * numbers["reserve"] / scale, 2)}
    return {"derived": numbers, "warnings": warnings}


def _edit(request: AuthenticatedHttpRequest, profile: AgentProfile | None) -> HttpResponse:
    if request.method == "POST":
        form = ProfileForm(request.POST, instance=profile, owner=request.user)
        if form.is_valid():
            saved = form.save(commit=False)
            saved.save(changed_by=request.user, change_source="form")
            if profile is not None:
                # Open session pages show the new threshold without a reload.
                transaction.on_commit(lambda: profile_announce(saved))
            return redirect("cl-profiles")
    else:
        form = ProfileForm(instance=profile, owner=request.user)
    extra = what_if_context(request, profile) if profile is not None else {}
    return render(request, FORM, {"form": form, "profile": profile, **_preview(form), **extra})


@require_http_methods(["GET", "POST"])
@login_required
def profile_create(request: AuthenticatedHttpRequest) -> HttpResponse:
    return _edit(request, None)


@require_http_methods(["GET", "POST"])
@login_required
def profile_edit(request: AuthenticatedHttpRequest, profile_id: int) -> HttpResponse:
    profile = AgentProfile.objects.filter(pk=profile_id, owner=request.user).first()
    if profile is None:
        raise Http404("No such profile")
    return _edit(request, profile)


@require_POST
@login_required
def profile_preview(request: AuthenticatedHttpRequest) -> HttpResponse:
    """The derived numbers for the form as typed, and every field's errors out of band."""
    raw = request.POST.get("profile_id", "")
    instance = AgentProfile.objects.filter(pk=int(raw), owner=request.user).first() if raw.isdigit() else None
    form = ProfileForm(request.POST, instance=instance, owner=request.user)
    form.is_valid()
    return render(request, f"{FORM}#preview", {"form": form, "preview_oob": True, **_preview(form)})
