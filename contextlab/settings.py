"""ContextLab settings: one module, configured by the environment.

Embedded default (no environment at all): SQLite under ``var/``, the in-memory
channel layer, jobs on a thread pool in the one web process. Scaled mode:
``DATABASE_URL`` (PostgreSQL) and ``REDIS_URL`` (channel layer and Celery broker).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import dj_database_url
from celery.schedules import crontab
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.getenv("CONTEXTLAB_VAR_DIR", BASE_DIR / "var")).expanduser()
# The SQLite file, workspaces and tokenizer files live here; SQLite will not
# create the folder itself.
VAR_DIR.mkdir(parents=True, exist_ok=True)


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


def install_secret_key(folder: Path) -> str:
    """Embedded mode's key: made once per install, kept in the var folder, readable by its owner only."""
    path = folder / "secret_key"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        key = path.read_text().strip()
        if key:
            return key
        raise ImproperlyConfigured(f"{path} is empty: delete it to make a new key, or set SECRET_KEY") from None
    key = secrets.token_urlsafe(50)
    with os.fdopen(fd, "w") as handle:
        handle.write(key + "\n")
    return key


DEBUG = envbool("DEBUG", "False")
SECRET_KEY = envsecret("SECRET_KEY", "")  # when unset, see below the databases
ALLOWED_HOSTS = [h for h in os.getenv("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver").split(",") if h]
CSRF_TRUSTED_ORIGINS = [o for o in os.getenv("CSRF_TRUSTED_ORIGINS", "").split(",") if o]
# The Content-Security-Policy of the HTML pages (contextlab/core/csp.py); empty: the built-in one.
CONTEXTLAB_CSP = os.getenv("CONTEXTLAB_CSP", "")

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
    "contextlab.gateway",
    "contextlab.dashboard",
    "contextlab.insights",
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
    "contextlab.core.csp.ContentSecurityPolicyMiddleware",
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
# synchronous=NORMAL is WAL's usual setting: a commit no longer waits for the
# disk (an fsync per turn was most of a small turn's cost); the database stays
# consistent, and only a power cut can lose the last commits, never a crash of
# the process.
DATABASES = {
    "default": dj_database_url.config(
        default=f"sqlite:///{VAR_DIR / 'contextlab.sqlite3'}",
        conn_max_age=envint("DB_CONN_MAX_AGE", "0"),
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The same backend, with this process's writers queued in order (contextlab.db.sqlite3).
    DATABASES["default"]["ENGINE"] = "contextlab.db.sqlite3"
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"init_command": ("PRAGMA busy_timeout = 10000; PRAGMA journal_mode = WAL; "
                          "PRAGMA synchronous = NORMAL;"),
         "transaction_mode": "IMMEDIATE"}
    )
    # Tests use an in-memory database, as Django's default for SQLite does. Said
    # explicitly because the backend is ours: pytest-xdist would otherwise name
    # each worker's test database after the file path of the real one.
    DATABASES["default"]["TEST"] = {"NAME": ":memory:"}

# Several processes on a shared database or Redis (scaled mode) must share one
# key, which only the operator can give them; an install on SQLite makes its own.
if not SECRET_KEY:
    if os.getenv("REDIS_URL") or DATABASES["default"]["ENGINE"] != "contextlab.db.sqlite3":
        raise ImproperlyConfigured(
            "SECRET_KEY is not set: in scaled mode (a shared database or REDIS_URL) every process needs the "
            "same secret key. Set SECRET_KEY (or SECRET_KEY_FILE) to a long random value, e.g. the output of "
            "python -c 'import secrets; print(secrets.token_urlsafe(50))'")
    SECRET_KEY = install_secret_key(VAR_DIR)

# HTTPS. A scaled deployment is served through a TLS proxy: its cookies are
# secure, plain HTTP is redirected, HSTS is sent and the proxy's
# X-Forwarded-Proto says which requests came over TLS. CONTEXTLAB_HTTPS sets
# all five at once (on in scaled mode except under the test runner, off in the
# embedded demo, which serves http://127.0.0.1); each Django setting of the same
# name, set in the environment, overrides it (docs/scaled-mode.md).
SCALED_MODE = bool(os.getenv("REDIS_URL")) or DATABASES["default"]["ENGINE"] != "contextlab.db.sqlite3"
HTTPS = envbool("CONTEXTLAB_HTTPS", "true" if SCALED_MODE and not os.getenv("PYTEST_VERSION") else "false")
_https = "true" if HTTPS else "false"
SESSION_COOKIE_SECURE = envbool("SESSION_COOKIE_SECURE", _https)
CSRF_COOKIE_SECURE = envbool("CSRF_COOKIE_SECURE", _https)
SECURE_SSL_REDIRECT = envbool("SECURE_SSL_REDIRECT", _https)
# A day to begin with: a browser that saw it will refuse plain HTTP for that long.
SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", "86400" if HTTPS else "0")
SECURE_HSTS_INCLUDE_SUBDOMAINS = envbool("SECURE_HSTS_INCLUDE_SUBDOMAINS", "false")
SECURE_HSTS_PRELOAD = envbool("SECURE_HSTS_PRELOAD", "false")
# "HEADER,VALUE" as Django spells it in request.META; empty: no proxy header is trusted.
_proxy_header = os.getenv("SECURE_PROXY_SSL_HEADER", "HTTP_X_FORWARDED_PROTO,https" if HTTPS else "")
SECURE_PROXY_SSL_HEADER = tuple(_proxy_header.split(",", 1)) if "," in _proxy_header else None
# The health check is asked by the load balancer over plain HTTP.
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
# Extending HSTS to every subdomain (W005) or into browsers' built-in lists
# (W021) reaches past this site: the operator opts in with the settings above.
SILENCED_SYSTEM_CHECKS = [check for check, chosen in (("security.W005", SECURE_HSTS_INCLUDE_SUBDOMAINS),
                                                       ("security.W021", SECURE_HSTS_PRELOAD)) if not chosen]

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# The first backend refuses a throttled login before any password is checked.
AUTHENTICATION_BACKENDS = ["contextlab.core.login_throttle.LoginThrottle", "django.contrib.auth.backends.ModelBackend"]
# Passwords people choose (createsuperuser, changepassword, the admin) are checked
# everywhere but the embedded demo on SQLite, whose well-known login is demo / demo.
AUTH_PASSWORD_VALIDATORS: list[dict[str, str]] = [] if (
    DATABASES["default"]["ENGINE"] == "contextlab.db.sqlite3" and not os.getenv("REDIS_URL")
) else [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# WhiteNoise serves the static files straight from where the finders find them
# (static/ and the apps' own, htmx's included), in every mode and with DEBUG
# off: no collect step exists that a fresh clone or a new process role could
# forget. It reads them once at start-up. A deployment that wants the files
# collected (for a CDN or a reverse proxy) names a folder and runs
# `manage.py collectstatic`; WhiteNoise then serves that folder too.
WHITENOISE_USE_FINDERS = True
STATIC_ROOT = os.getenv("CONTEXTLAB_STATIC_ROOT") or None

REDIS_URL = os.getenv("REDIS_URL", "")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [REDIS_URL]}}
    }
else:
    CHANNEL_LAYERS = {
        "default": {"BACKEND": "channels.layers.InMemoryChannelLayer", "CONFIG": {"capacity": 1000}}
    }

# -- background jobs (Celery) --------------------------------------------------------------
# Embedded mode (no REDIS_URL): no broker process. A job runs on a small thread
# pool inside the web process (contextlab.support.jobs.enqueue) and the beat scheduler is
# a thread of that process (started from contextlab/asgi.py), so what they
# publish reaches the in-memory channel layer, which exists only in that process.
# Scaled mode (REDIS_URL and DATABASE_URL): Redis is the broker; `celery worker`
# and `celery beat` are processes of their own (see the Procfile).
CONTEXTLAB_JOBS_MODE = "scaled" if REDIS_URL else "embedded"
CELERY_BROKER_URL = REDIS_URL or "memory://"
CELERY_TASK_ALWAYS_EAGER = not REDIS_URL
CELERY_TASK_EAGER_PROPAGATES = True
# The run rows are the results the pages read; Celery keeps none.
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_DEFAULT_QUEUE = os.getenv("CONTEXTLAB_CELERY_QUEUE", "contextlab")
# Acknowledge a job when it ends, not when it starts: when the process running
# it dies, Redis still holds it and it is run again. The run row and a database
# lock (contextlab.support.jobs.hold_run) make a second run of the same job safe.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Every key the broker writes starts with this prefix, so two deployments (or two
# test runs) can share one Redis without taking each other's jobs.
REDIS_PREFIX = os.getenv("CONTEXTLAB_REDIS_PREFIX", "")
if os.getenv("PYTEST_XDIST_WORKER"):
    # Parallel test workers share one Redis but each has its own database, so
    # their session ids, rate-limit keys and jobs would meet: one prefix each.
    REDIS_PREFIX = f"{REDIS_PREFIX}{os.environ['PYTEST_XDIST_WORKER']}:"
if REDIS_PREFIX:
    CELERY_BROKER_TRANSPORT_OPTIONS = {"global_keyprefix": REDIS_PREFIX}
if REDIS_URL:
    # redis-py 8 gives up reading a socket after 5 s by default: exactly how long
    # channels-redis blocks waiting for a quiet page's next event (BZPOPMIN). The
    # two race, the read loses now and then, and the page's socket is closed. A
    # read timeout well above the 5 s wait keeps idle pages connected.
    CHANNEL_LAYERS["default"]["CONFIG"] = {
        "hosts": [{"address": REDIS_URL, "socket_timeout": envint("CONTEXTLAB_REDIS_READ_TIMEOUT", "30")}],
        "prefix": f"{REDIS_PREFIX}asgi" if REDIS_PREFIX else "asgi",
    }
CELERY_TIMEZONE = "UTC"
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
# Seconds between two sweeps for runs whose worker died (see services.runs_reap).
CONTEXTLAB_REAP_SECONDS = envint("CONTEXTLAB_REAP_SECONDS", "30")
# Seconds between the beat's sweeps for observed calls left pending (contextlab.gateway.tasks).
CONTEXTLAB_SETTLE_SECONDS = envint("CONTEXTLAB_SETTLE_SECONDS", "60")
# A run still queued after this many minutes is failed by the sweep: its job was
# lost (Redis lost its data) or no worker is running.
CONTEXTLAB_QUEUED_MINUTES = envint("CONTEXTLAB_QUEUED_MINUTES", "30")
# A profile's what-if replays at most this many turns of the chosen session (its cost is CPU only).
CONTEXTLAB_WHAT_IF_MAX_TURNS = envint("CONTEXTLAB_WHAT_IF_MAX_TURNS", "200")
# Daily notes of this many days (the day that ended included) go into MEMORY.md.
CONTEXTLAB_MEMORY_DAYS = envint("CONTEXTLAB_MEMORY_DAYS", "7")
CELERY_BEAT_SCHEDULE = {
    "prune-expired-files": {
        "task": "contextlab.sessions.tasks.prune_expired_files",
        "schedule": crontab(minute=int(os.getenv("CONTEXTLAB_PRUNE_MINUTE", "30")),
                            hour=int(os.getenv("CONTEXTLAB_PRUNE_HOUR", "3"))),
    },
    # Every quarter hour, on the quarter: consolidation runs for the profiles
    # whose local midnight fell in the quarter that just ended (every UTC offset
    # in use is a whole number of quarter hours).
    "consolidate-memory": {
        "task": "contextlab.sessions.tasks.consolidate_memory",
        "schedule": crontab(minute="0,15,30,45"),
    },
    "reap-stale-runs": {
        "task": "contextlab.sessions.tasks.reap_stale_runs",
        "schedule": float(CONTEXTLAB_REAP_SECONDS),
    },
    # Observe mode's calls a stopped process committed but never took into their
    # sessions, when no later call of their profile came to do it.
    "settle-observed-calls": {
        "task": "contextlab.gateway.tasks.settle_observed_calls",
        "schedule": float(CONTEXTLAB_SETTLE_SECONDS),
    },
}
# Threads of the embedded job pool: compactions mostly wait for the LLM.
CONTEXTLAB_JOB_THREADS = envint("CONTEXTLAB_JOB_THREADS", "2")
# The embedded beat thread starts with the ASGI application. Under pytest it
# stays off unless asked for, so no periodic job touches a test database.
CONTEXTLAB_EMBEDDED_BEAT = envbool("CONTEXTLAB_EMBEDDED_BEAT", "false" if os.getenv("PYTEST_VERSION") else "true")
# The server settles observe mode's pending calls (committed, not yet in their
# sessions: a process killed after answering) when the ASGI application loads.
# Under pytest it stays off unless asked for: importing contextlab.asgi in a test
# must not touch a database before the test database exists.
CONTEXTLAB_SETTLE_AT_START = envbool("CONTEXTLAB_SETTLE_AT_START", "false" if os.getenv("PYTEST_VERSION") else "true")
# Observe mode answers the agent once the call is committed as a pending record,
# and rebuilds the session after the answer has left (contextlab.gateway.observe).
CONTEXTLAB_OBSERVE_ANSWER_FIRST = envbool("CONTEXTLAB_OBSERVE_ANSWER_FIRST", "true")

# The upstream providers a profile may send its summaries to, as JSON:
# {"openai": {"base_url": "https://api.openai.com/v1", "api_key_env": "OPENAI_API_KEY"}}.
# Users choose among these names; URLs and key variables are the operator's (contextlab.support.providers).
CONTEXTLAB_PROVIDERS = os.getenv("CONTEXTLAB_PROVIDERS", "")

# Requests per API token: "REQUESTS/SECONDS", or "0" for no limit. Generous by
# default: they stop a runaway client, not an agent at work.
CONTEXTLAB_RATE_LIMIT_API = os.getenv("CONTEXTLAB_RATE_LIMIT_API", "6000/60")
CONTEXTLAB_RATE_LIMIT_GATEWAY = os.getenv("CONTEXTLAB_RATE_LIMIT_GATEWAY", "3000/60")
# Seconds a client has to send a request's headers, however slowly it sends
# them, before daphne closes the connection (contextlab/core/bodylimit.py); 0: no limit.
CONTEXTLAB_HEADER_TIMEOUT = float(os.getenv("CONTEXTLAB_HEADER_TIMEOUT", "20"))
# Upstream providers at link-local or cloud-metadata addresses (contextlab/gateway/trust.py):
# refused in the admin unless the operator allows them here.
CONTEXTLAB_ALLOW_LINK_LOCAL_UPSTREAMS = envbool("CONTEXTLAB_ALLOW_LINK_LOCAL_UPSTREAMS", "false")
# Failed password logins: once an account name, or a client address, has this
# many in a window, its logins are refused (even the right password) until the
# window is over (contextlab/core/login_throttle.py).
CONTEXTLAB_RATE_LIMIT_LOGIN_USER = os.getenv("CONTEXTLAB_RATE_LIMIT_LOGIN_USER", "10/900")
CONTEXTLAB_RATE_LIMIT_LOGIN_IP = os.getenv("CONTEXTLAB_RATE_LIMIT_LOGIN_IP", "50/900")

# Where session workspaces (dialog/, tool_result/, ...) live.
WORKSPACES_DIR = Path(os.getenv("CONTEXTLAB_WORKSPACES_DIR", VAR_DIR / "workspaces"))
# Largest request body the JSON API reads (tool outputs of several MB are
# normal); a bigger body is refused with 413 naming "body".
DATA_UPLOAD_MAX_MEMORY_SIZE = envint("CONTEXTLAB_MAX_BODY_BYTES", str(32 * 1024 * 1024))
# Largest transcript or session bundle accepted for import.
CONTEXTLAB_MAX_UPLOAD_BYTES = envint("CONTEXTLAB_MAX_UPLOAD_BYTES", str(256 * 1024 * 1024))
# What an import may take in memory once parsed: twice its upload plus this. A
# zip's upload is its compressed size, so a well-compressed honest archive (a
# CoPaw workspace of long dialogs) may need more than the default allows; the
# refusal names this setting.
CONTEXTLAB_IMPORT_MEMORY_SLACK_BYTES = envint("CONTEXTLAB_IMPORT_MEMORY_SLACK_BYTES", str(6 * 1024 * 1024))
# Largest request body the server receives at all (an upload and its form
# fields); refused with 413 while it arrives. Without credentials the limit is
# DATA_UPLOAD_MAX_MEMORY_SIZE.
CONTEXTLAB_MAX_REQUEST_BYTES = envint("CONTEXTLAB_MAX_REQUEST_BYTES", str(CONTEXTLAB_MAX_UPLOAD_BYTES + 1024 * 1024))
# Where the tiktoken vocabularies are installed by scripts/install_tiktoken_data.py.
TIKTOKEN_DIR = Path(os.getenv("CONTEXTLAB_TIKTOKEN_DIR", VAR_DIR / "tiktoken"))
os.environ.setdefault("CONTEXTLAB_TIKTOKEN_DIR", str(TIKTOKEN_DIR))

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.getenv("LOG_LEVEL", "INFO")},
}
