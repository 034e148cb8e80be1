"""Per-user API tokens for ``Authorization: Bearer <token>``."""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.contrib.auth.models import User
from django.db import models
from django.utils import timezone

TOKEN_PREFIX = "cl_"


def hash_token(token: str) -> str:
    # A plain SHA-256 is enough: tokens are 256 random bits, so there is nothing
    # for a slow password hash to protect against, and lookups stay one query.
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class ApiToken(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, blank=True)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    # The first characters, so a person can tell their tokens apart.
    prefix = models.CharField(max_length=12, editable=False)
    created = models.DateTimeField(default=timezone.now)
    last_used = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name or 'unnamed'})"

    @classmethod
    def issue(cls, *, user: User, name: str = "") -> tuple[ApiToken, str]:
        """Create a token; the clear text is returned once and never stored."""
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        row = cls.objects.create(user=user, name=name, key_hash=hash_token(token), prefix=token[:8])
        return row, token
