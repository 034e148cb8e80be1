"""ASGI entry point: HTTP through Django, WebSockets through Channels."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "contextlab.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs the apps loaded first)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from contextlab.core.bodylimit import BodyLimitMiddleware, guard_daphne  # noqa: E402
from contextlab.dashboard.routing import websocket_urlpatterns  # noqa: E402

# Bodies are capped before they are read: by daphne while receiving, and by the
# middleware for any other server.
guard_daphne()
application = ProtocolTypeRouter(
    {
        "http": BodyLimitMiddleware(django_asgi_app),
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)

# Embedded mode: the job pool and the beat scheduler live in this process, the
# only one that can reach the in-memory channel layer. Started here, once per
# server process, rather than in AppConfig.ready (which every management
# command runs too). A no-op in scaled mode, where `celery worker` and
# `celery beat` are processes of their own.
from contextlab.support.jobs import start_embedded  # noqa: E402

start_embedded()

# Observe mode commits each call before answering and takes it into its session
# after: the calls a killed process left pending are settled now, before this
# server accepts a connection (nothing else runs yet, so nothing races them).
from contextlab.gateway.observe import settle_at_start  # noqa: E402

settle_at_start()
