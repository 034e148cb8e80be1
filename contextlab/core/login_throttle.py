"""Password logins throttled per account and per client address.

Failed logins are counted in fixed windows (``CONTEXTLAB_RATE_LIMIT_LOGIN_USER``
per account name, ``CONTEXTLAB_RATE_LIMIT_LOGIN_IP`` per address; the rate
limiter's counters, so scaled mode shares them through Redis). Once either
count reaches its limit, every login of that account or from that address is
refused, the right password included, until the window is over:

- ``LoginThrottle``, first in ``AUTHENTICATION_BACKENDS``, stops any password
  login (the login page, the admin's) before a password is checked;
- ``ThrottledAuthenticationForm`` says so in words on the login pages, instead
  of Django's "enter a correct username and password".
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

from django import forms
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.signals import user_login_failed
from django.core.exceptions import PermissionDenied
from django.dispatch import receiver
from django.http import HttpRequest

from contextlab.support import ratelimit

USER_SCOPE = "login_user"
IP_SCOPE = "login_ip"


def _keys(request: HttpRequest | None, username: str | None) -> list[tuple[str, str]]:
    keys = []
    if username:
        # Hashed: an account name is the client's text, of any length.
        keys.append((USER_SCOPE, hashlib.sha256(username.strip().casefold().encode()).hexdigest()))
    address = request.META.get("REMOTE_ADDR") if request is not None else None
    if address:
        keys.append((IP_SCOPE, hashlib.sha256(str(address).encode()).hexdigest()))
    return keys


def retry_after(request: HttpRequest | None, username: str | None) -> int | None:
    """Seconds until a login of ``username`` from this request's address may be tried again, or None."""
    waits = [wait for scope, key in _keys(request, username) if (wait := ratelimit.exhausted(scope, key)) is not None]
    return max(waits) if waits else None


def record_failure(request: HttpRequest | None, username: str | None) -> None:
    for scope, key in _keys(request, username):
        ratelimit.record(scope, key)


@receiver(user_login_failed, dispatch_uid="contextlab-login-throttle")
def _on_login_failed(sender: Any, credentials: dict[str, Any], request: HttpRequest | None = None,
                     **kwargs: Any) -> None:
    record_failure(request, credentials.get("username"))


def refusal(seconds: int) -> str:
    minutes = math.ceil(seconds / 60)
    wait = f"{minutes} minute{'s' if minutes != 1 else ''}" if seconds > 60 else f"{seconds} seconds"
    return (f"Too many failed logins for this account or from this address. Logins are refused, even with "
            f"the right password, for {wait}; try again then.")


class LoginThrottle:
    """An authentication backend that authenticates no one: it stops the others while a login is throttled.

    It has no ``get_user``, so sessions never name it and ``force_login`` skips it.
    """

    def authenticate(self, request: HttpRequest | None, username: str | None = None,
                     password: str | None = None, **kwargs: Any) -> None:
        if password is not None and retry_after(request, username) is not None:
            raise PermissionDenied("login throttled")


class _ThrottledForm:
    """Checks the throttle before the password, so a throttled login is told why in words."""

    request: HttpRequest | None
    cleaned_data: dict[str, Any]
    # The refusal, for the login page to show instead of "did not match".
    throttled = ""

    def clean(self) -> dict[str, Any]:
        wait = retry_after(self.request, self.cleaned_data.get("username"))
        if wait is not None:
            self.throttled = refusal(wait)
            raise forms.ValidationError(self.throttled, code="throttled")
        cleaned: dict[str, Any] = super().clean()  # type: ignore[misc]
        return cleaned


class ThrottledAuthenticationForm(_ThrottledForm, AuthenticationForm):
    pass


class ThrottledAdminAuthenticationForm(_ThrottledForm, AdminAuthenticationForm):
    pass
