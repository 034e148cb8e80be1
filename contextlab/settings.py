"""ContextLab settings: one module, configured by the environment.

Embedded default (no environment at all): SQLite under ``var/``, the in-memory
channel layer, jobs on a thread pool in the one web process. Scaled mode:
``DATABASE_URL`` (PostgreSQL) and ``REDIS_URL`` (channel layer and Celery broker).
"""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.getenv("CONTEXTLAB_VAR_DIR", BASE_DIR / "var"))


def envbool(name: str, default: str) -> bool:
    return os.getenv(name, default).lower() in ("1", "true", "yes", "on")


def envint(name: str, default: str) -> int:
    return int(os.getenv(name, default))


def envsecret(name: str, default: str) -> str:
    """A secret from NAME, or from the file named by NAME_FILE."""
    file_name = os.getenv(f"{name}_FILE")
    if file_name:
        return Path(file_name).read_text().strip()
    return os.getenv(name, default)


DEBUG = envbool("DEBUG", "False")
SECRET_KEY = envsecret("SECRET_KEY", "contextlab-development-key-change-me-in-production")
ALLOWED_HOSTS = [h for h in os.getenv("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver").split(",") if h]
CSRF_TRUSTED_ORIGINS = [o for o in os.getenv("CSRF_TRUSTED_ORIGINS", "").split(",") if o]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "channels",
    "django_htmx",
    "template_partials",
    "contextlab.core",
    "contextlab.sessions",
    "contextlab.api",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "contextlab.urls"
ASGI_APPLICATION = "contextlab.asgi.application"
WSGI_APPLICATION = "contextlab.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# Default database engine is SQLite, so a fresh checkout runs as it is.
# IMMEDIATE transactions make two writers on one session queue up instead of
# failing half-way (the hook and a manual compaction must never interleave).
DATABASES = {
    "default": dj_database_url.config(
        default=f"sqlite:///{VAR_DIR / 'contextlab.sqlite3'}",
        conn_max_age=envint("DB_CONN_MAX_AGE", "0"),
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"init_command": "PRAGMA busy_timeout = 10000; PRAGMA journal_mode = WAL;",
         "transaction_mode": "IMMEDIATE"}
    )

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
AUTH_PASSWORD_VALIDATORS: list[dict[str, str]] = []
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"

REDIS_URL = os.getenv("REDIS_URL", "")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [REDIS_URL]}}
    }
else:
    CHANNEL_LAYERS = {
        "default": {"BACKEND": "channels.layers.InMemoryChannelLayer", "CONFIG": {"capacity": 1000}}
    }

# Where session workspaces (dialog/, tool_result/, ...) live.
WORKSPACES_DIR = Path(os.getenv("CONTEXTLAB_WORKSPACES_DIR", VAR_DIR / "workspaces"))
# Largest request body the JSON API reads (tool outputs of several MB are
# normal); a bigger body is refused with 413 naming "body".
DATA_UPLOAD_MAX_MEMORY_SIZE = envint("CONTEXTLAB_MAX_BODY_BYTES", str(32 * 1024 * 1024))
# Largest transcript or session bundle accepted for import.
CONTEXTLAB_MAX_UPLOAD_BYTES = envint("CONTEXTLAB_MAX_UPLOAD_BYTES", str(256 * 1024 * 1024))
# Where the tiktoken vocabularies are installed by scripts/install_tiktoken_data.py.
TIKTOKEN_DIR = Path(os.getenv("CONTEXTLAB_TIKTOKEN_DIR", VAR_DIR / "tiktoken"))
os.environ.setdefault("CONTEXTLAB_TIKTOKEN_DIR", str(TIKTOKEN_DIR))

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.getenv("LOG_LEVEL", "INFO")},
}
