"""Issue 30 item 4: password logins are throttled per account and per address; passwords are checked.

Counted in memory in embedded mode and in Redis when the suite runs in scaled
mode, with the same assertions.

Many wrong passwords, then the right one: refused with a message that says
why, until the window is over. The clock is the rate limiter's, moved forward
instead of waited for.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import authenticate
from django.test import Client, RequestFactory

from contextlab.support import ratelimit

REPO = Path(__file__).resolve().parents[2]
REFUSED = "Too many failed logins for this account or from this address"


@pytest.fixture(autouse=True)
def _limits(settings: Any) -> Iterator[None]:
    settings.CONTEXTLAB_RATE_LIMIT_LOGIN_USER = "5/900"
    settings.CONTEXTLAB_RATE_LIMIT_LOGIN_IP = "12/900"
    # Counted in Redis when the suite runs in scaled mode (REDIS_URL set), else in memory.
    _forget(settings)
    yield
    _forget(settings)


def _forget(settings: Any) -> None:
    ratelimit._local.clear()
    if settings.REDIS_URL:
        redis = ratelimit._redis(settings.REDIS_URL)
        for key in redis.scan_iter(f"{settings.REDIS_PREFIX}ratelimit:login_*"):
            redis.delete(key)


@pytest.fixture
def later(monkeypatch: pytest.MonkeyPatch):
    """Moves the rate limiter's clock forward by some seconds.

    It starts one second into a 15-minute window, so no test straddles two.
    """
    real = time.time
    now = real()
    shift = [math.ceil(now / 900) * 900 + 1 - now]
    monkeypatch.setattr(ratelimit.time, "time", lambda: real() + shift[0])

    def forward(seconds: float) -> None:
        shift[0] += seconds

    return forward


def _log_in(client: Client, username: str, password: str, address: str = "10.0.0.1") -> Any:
    return client.post("/accounts/login/", {"username": username, "password": password}, REMOTE_ADDR=address)


def _logged_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


def test_it_refuses_even_the_right_password_after_too_many_wrong_ones(alice, later):
    client = Client()
    for _ in range(5):
        answer = _log_in(client, "alice", "wrong-password")
        assert answer.status_code == 200 and "didn't match" in answer.content.decode()
    answer = _log_in(client, "alice", "alice-password")
    page = answer.content.decode()
    assert answer.status_code == 200 and not _logged_in(client)
    assert REFUSED in page
    assert "even with the right password, for 15 minutes; try again then" in page
    # Another address does not help: the account itself is throttled.
    assert not _logged_in(c := Client()) and REFUSED in _log_in(c, "ALICE", "alice-password", "10.9.9.9").content.decode()
    later(901)
    answer = _log_in(client, "alice", "alice-password")
    assert answer.status_code == 302 and _logged_in(client)


def test_it_throttles_an_address_trying_many_accounts(alice, bob, later):
    client = Client()
    for n in range(12):
        _log_in(client, f"someone-{n}", "guess", "10.0.0.7")
    assert REFUSED in _log_in(client, "bob", "bob-password", "10.0.0.7").content.decode()
    assert not _logged_in(client)
    # Bob himself, from his own address, is not affected.
    other = Client()
    assert _log_in(other, "bob", "bob-password", "10.0.0.8").status_code == 302
    later(901)
    assert _log_in(client, "bob", "bob-password", "10.0.0.7").status_code == 302


def test_it_stops_every_password_login_not_only_the_login_page(alice, later):
    alice.is_staff = alice.is_superuser = True
    alice.save()
    request = RequestFactory().post("/admin/login/", REMOTE_ADDR="10.0.0.2")
    for _ in range(5):
        assert authenticate(request, username="alice", password="nope") is None
    assert authenticate(request, username="alice", password="alice-password") is None
    admin = Client()
    answer = admin.post("/admin/login/", {"username": "alice", "password": "alice-password", "next": "/admin/"},
                        REMOTE_ADDR="10.0.0.3")
    assert answer.status_code == 200 and REFUSED in answer.content.decode() and not _logged_in(admin)
    later(901)
    assert authenticate(request, username="alice", password="alice-password") == alice


def test_a_forced_login_is_unaffected(client, alice):
    # Sessions name the password backend, never the throttle.
    client.force_login(alice)
    assert client.get("/").status_code == 200


def _validators(**env: str) -> str:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("SECRET_KEY", "DATABASE_URL", "REDIS_URL") and not k.startswith("PYTEST")}
    clean.update({"DJANGO_SETTINGS_MODULE": "contextlab.settings", "SECRET_KEY": "k" * 60, **env})
    done = subprocess.run([sys.executable, "-c", "import django; django.setup(); from django.conf import settings; "
                           "print(len(settings.AUTH_PASSWORD_VALIDATORS))"],
                          cwd=REPO, env=clean, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_passwords_are_validated_outside_the_embedded_demo(tmp_path):
    assert _validators(CONTEXTLAB_VAR_DIR=str(tmp_path)) == "0"
    assert _validators(CONTEXTLAB_VAR_DIR=str(tmp_path), DATABASE_URL="postgres://postgres@127.0.0.1:5432/x") == "4"
    assert _validators(CONTEXTLAB_VAR_DIR=str(tmp_path), REDIS_URL="redis://127.0.0.1:6379/9") == "4"
