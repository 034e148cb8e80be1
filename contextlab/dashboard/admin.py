from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest

from contextlab.dashboard.forms import ToolNamesField, apply_bounds
from contextlab.sessions import services
from contextlab.sessions.models import (
    LIST_KNOBS,
    AgentProfile,
    AgentSession,
    CompactionRun,
    OffloadedFile,
    ProfileVersion,
    SessionMessage,
    SummaryVersion,
    Turn,
)

# ModelAdmin is generic only in the type stubs (it has no __class_getitem__ at
# runtime without django-stubs-ext), hence the type-arg ignores below.


@admin.register(AgentProfile)
class AgentProfileAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("name", "owner", "policy", "max_input_length", "compact_ratio", "reserve_ratio", "compactor")
    list_filter = ("policy", "compactor")
    search_fields = ("name", "owner__username")
    readonly_fields = ("derived_threshold", "derived_reserve")
    # Django 6 makes https the default scheme of a URL typed without one; say so now.
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}

    def formfield_for_dbfield(self, db_field: models.Field[Any, Any], request: HttpRequest,
                              **kwargs: Any) -> forms.Field | None:
        if db_field.name in LIST_KNOBS:
            # Tool names as text, as on the dashboard's form ("Bash, Read"), not JSON to type by hand.
            return ToolNamesField(required=False, label=db_field.verbose_name.capitalize(),
                                  help_text=db_field.help_text)
        field = super().formfield_for_dbfield(db_field, request, **kwargs)
        if field is not None:
            apply_bounds(db_field.name, field)
        return field

    # A form re-shown with invalid values carries them on ``obj``: the engine
    # refuses to build a profile from them, so these read the raw numbers.
    # Recorded in the profile's history as the admin's change.
    def save_model(self, request: HttpRequest, obj: AgentProfile, form: Any, change: bool) -> None:
        obj.save(changed_by=request.user, change_source="admin")

    @admin.display(description="threshold (tokens)")
    def derived_threshold(self, obj: AgentProfile) -> str:
        return _derived(obj, "compact_ratio") if obj.pk else "-"

    @admin.display(description="reserve (tokens)")
    def derived_reserve(self, obj: AgentProfile) -> str:
        return _derived(obj, "reserve_ratio") if obj.pk else "-"


def _derived(obj: AgentProfile, ratio: str) -> str:
    try:
        return f"{int(int(obj.max_input_length) * float(getattr(obj, ratio))):,}"
    except (TypeError, ValueError):
        return "-"


@admin.register(ProfileVersion)
class ProfileVersionAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """The history is a record: read it here, change it nowhere."""

    list_display = ("profile", "number", "changed_by", "source", "created")
    list_filter = ("source",)
    readonly_fields = ("profile", "number", "changed_by", "source", "changes", "values", "created")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(AgentSession)
class AgentSessionAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("display_title", "owner", "profile", "status", "tokens_used", "turns_count",
                    "compactions_count", "failures_count", "last_activity")
    list_filter = ("status", "profile__policy")
    search_fields = ("id", "title", "owner__username")
    raw_id_fields = ("owner", "profile")
    # The engine's state is written by the services only; editing it by hand
    # would desynchronise it from the message, turn and file rows.
    readonly_fields = ("id", "engine_state", "summary", "summary_version", "source")

    # Through the service, so the session's workspace folder goes with it.
    def delete_model(self, request: HttpRequest, obj: AgentSession) -> None:
        services.session_delete(session=obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[AgentSession]) -> None:
        for session in queryset:
            services.session_delete(session=session)


@admin.register(SessionMessage)
class SessionMessageAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("message_id", "session", "seq", "role", "status", "tokens", "truncated_stage", "compacted_turn")
    list_filter = ("status", "role")
    search_fields = ("message_id", "session__id")
    raw_id_fields = ("session",)


@admin.register(Turn)
class TurnAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("session", "number", "trigger", "outcome", "payload_tokens", "compacted_count", "duration_ms")
    list_filter = ("outcome", "trigger", "policy")
    raw_id_fields = ("session",)


@admin.register(SummaryVersion)
class SummaryVersionAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("session", "version", "turn", "compactor", "fallback", "created")
    list_filter = ("compactor", "fallback")
    raw_id_fields = ("session",)


@admin.register(OffloadedFile)
class OffloadedFileAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("path", "session", "tool", "stage", "bytes", "kept_bytes", "expires_at", "referenced")
    list_filter = ("stage", "referenced")
    raw_id_fields = ("session",)


@admin.register(CompactionRun)
class CompactionRunAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("session", "status", "trigger", "turn_number", "outcome", "created", "finished")
    list_filter = ("status",)
    raw_id_fields = ("session", "requested_by")
