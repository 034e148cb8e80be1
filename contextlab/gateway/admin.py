from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.db import models
from django.http import HttpRequest

from contextlab.gateway.models import GatewayExchange, GatewaySession, UpstreamProvider
from contextlab.support import providers

# ModelAdmin is generic only in the type stubs (it has no __class_getitem__ at
# runtime without django-stubs-ext), hence the type-arg ignores below.


def _formfield(field: models.Field, **kwargs: Any) -> forms.Field | None:  # type: ignore[type-arg]
    # Django 6 makes https the default scheme of a URL typed without one; say so now.
    if isinstance(field, models.URLField):
        kwargs.setdefault("assume_scheme", "https")
    return field.formfield(**kwargs)


class UpstreamProviderForm(forms.ModelForm):  # type: ignore[type-arg]
    # The stored key is never shown again: an empty field keeps it, the
    # checkbox removes it.
    api_key = forms.CharField(
        required=False, widget=forms.PasswordInput(render_value=False), max_length=500,
        help_text="the provider key, stored in the database; leave empty to keep the stored one "
                  "(or use the environment variable instead)")
    clear_api_key = forms.BooleanField(required=False, label="remove the stored key")

    class Meta:
        model = UpstreamProvider
        formfield_callback = _formfield
        fields = ["profile", "base_url", "api_key_env", "api_key", "clear_api_key", "model_map", "timeout",
                  "extra_headers", "identity", "mode", "kind", "credential", "context_edits"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Left out of a form posted without them (a script written before they existed),
        # the model's defaults stand: openai, the stored key, edits run by the provider.
        for name in ("kind", "credential", "context_edits"):
            self.fields[name].required = False

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        if cleaned.get("clear_api_key"):
            cleaned["api_key"] = ""
        elif not cleaned.get("api_key") and self.instance.pk:
            # Kept as stored (encrypted).
            cleaned["api_key"] = UpstreamProvider.objects.get(pk=self.instance.pk).api_key
        elif cleaned.get("api_key"):
            cleaned["api_key"] = providers.encrypt_secret(cleaned["api_key"])
        self.instance.api_key = cleaned.get("api_key", "")
        return cleaned


@admin.register(UpstreamProvider)
class UpstreamProviderAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    form = UpstreamProviderForm
    list_display = ("profile", "kind", "base_url", "key_source", "credential", "timeout", "identity", "updated")
    search_fields = ("profile__name", "profile__owner__username", "base_url")
    raw_id_fields = ("profile",)

    @admin.display(description="key")
    def key_source(self, obj: UpstreamProvider) -> str:
        if obj.api_key_env:
            return f"${obj.api_key_env}"
        return "stored" if obj.api_key else "none"


@admin.register(GatewaySession)
class GatewaySessionAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("session", "owner", "kind", "short_key", "history_length", "forked_from", "updated")
    list_filter = ("kind",)
    search_fields = ("key", "session__id", "owner__username")
    # The history is the gateway's record of what it ingested; edited by hand
    # it would no longer match the session's messages.
    readonly_fields = ("session", "owner", "key", "kind", "history_length", "history_chain", "history_before_last",
                       "forked_from", "created", "updated")

    @admin.display(description="key")
    def short_key(self, obj: GatewaySession) -> str:
        return obj.key if len(obj.key) <= 48 else obj.key[:47] + "…"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(GatewayExchange)
class GatewayExchangeAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("created", "owner", "session", "turn_number", "stream", "status_code", "managed",
                    "identity", "error_stage", "prepare_ms", "upstream_ms")
    list_filter = ("managed", "stream", "error_stage", "identity")
    search_fields = ("session__id", "error", "owner__username")
    date_hierarchy = "created"
    raw_id_fields = ("owner", "profile", "session")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        # A record of what happened: read-only.
        return [f.name for f in GatewayExchange._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
