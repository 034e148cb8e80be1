from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from contextlab.api.models import ApiToken

# ModelAdmin is generic only in the type stubs (it has no __class_getitem__ at
# runtime without django-stubs-ext), hence the type-arg ignores below.


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    # Tokens are issued by `manage.py createapitoken`; only the hash is stored,
    # so the admin can list and revoke them but not create one.
    list_display = ("prefix", "name", "user", "created", "last_used")
    search_fields = ("name", "user__username", "prefix")
    readonly_fields = ("prefix", "key_hash", "created", "last_used")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
