"""Issue 30 item 5: the HTTPS settings come from the environment, on by default in scaled mode.

Settings are loaded in a child process with the environment a deployment
would give it (no pytest variables, which turn the scaled default off for the
in-process test client's plain HTTP).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCALED = {"DATABASE_URL": "postgres://postgres@127.0.0.1:5432/cl_never_connected",
          "REDIS_URL": "redis://127.0.0.1:6379/15"}
SHOW = ("import django, json; django.setup(); from django.conf import settings as s; print(json.dumps({n: "
        "getattr(s, n) for n in ('SESSION_COOKIE_SECURE', 'CSRF_COOKIE_SECURE', 'SECURE_SSL_REDIRECT', "
        "'SECURE_HSTS_SECONDS', 'SECURE_PROXY_SSL_HEADER')}))")


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST", "SECURE_", "SESSION_", "CSRF_", "CONTEXTLAB_HTTPS"))
           # The browser tests' conftest sets DJANGO_ALLOW_ASYNC_UNSAFE for Playwright; no deployment does.
           and k not in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DEBUG", "ALLOWED_HOSTS",
                         "DJANGO_ALLOW_ASYNC_UNSAFE")}
    env.update({"DJANGO_SETTINGS_MODULE": "contextlab.settings", "CONTEXTLAB_VAR_DIR": str(tmp_path),
                "SECRET_KEY": secrets.token_urlsafe(50), **extra})
    return env


def _check_deploy(tmp_path: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"], cwd=REPO,
                          env=_env(tmp_path, **extra), capture_output=True, text=True, timeout=180)


def _settings(tmp_path: Path, **extra: str) -> dict:
    done = subprocess.run([sys.executable, "-c", SHOW], cwd=REPO, env=_env(tmp_path, **extra), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_check_deploy_is_clean_under_the_scaled_settings(tmp_path):
    done = _check_deploy(tmp_path, **SCALED)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout


def test_check_deploy_names_what_an_operator_turned_off(tmp_path):
    done = _check_deploy(tmp_path, **SCALED, CONTEXTLAB_HTTPS="0")
    assert done.returncode != 0
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert warning in done.stderr + done.stdout


def test_the_https_settings_follow_the_mode_and_each_variable(tmp_path):
    assert _settings(tmp_path, **SCALED) == {
        "SESSION_COOKIE_SECURE": True, "CSRF_COOKIE_SECURE": True, "SECURE_SSL_REDIRECT": True,
        "SECURE_HSTS_SECONDS": 86400, "SECURE_PROXY_SSL_HEADER": ["HTTP_X_FORWARDED_PROTO", "https"]}
    # Only a shared database is enough to be scaled mode.
    assert _settings(tmp_path, DATABASE_URL=SCALED["DATABASE_URL"])["SECURE_SSL_REDIRECT"] is True
    # The embedded demo serves http://127.0.0.1.
    assert _settings(tmp_path) == {
        "SESSION_COOKIE_SECURE": False, "CSRF_COOKIE_SECURE": False, "SECURE_SSL_REDIRECT": False,
        "SECURE_HSTS_SECONDS": 0, "SECURE_PROXY_SSL_HEADER": None}
    chosen = _settings(tmp_path, **SCALED, SECURE_SSL_REDIRECT="false", SECURE_HSTS_SECONDS="31536000",
                       SECURE_PROXY_SSL_HEADER="HTTP_X_FORWARDED_SCHEME,https")
    assert chosen["SECURE_SSL_REDIRECT"] is False and chosen["SECURE_HSTS_SECONDS"] == 31536000
    assert chosen["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_SCHEME", "https"]
    assert chosen["SESSION_COOKIE_SECURE"] is True
    assert _settings(tmp_path, **SCALED, SECURE_PROXY_SSL_HEADER="")["SECURE_PROXY_SSL_HEADER"] is None


def test_the_web_role_listens_where_the_operator_says(tmp_path):
    procfile = (REPO / "Procfile").read_text()
    web = next(line for line in procfile.splitlines() if line.startswith("web:"))
    assert "--host ${CONTEXTLAB_BIND_ADDRESS:-127.0.0.1}" in web
    assert "0.0.0.0" not in web
