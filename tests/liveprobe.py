"""The real ASGI application plus a probe websocket, for the scaled tests and the latency benchmark.

``/probe/sessions/<id>/`` joins the session's group the way the dashboard page
does and forwards every event the services publish as JSON, unrendered and
without a login, so a test sees exactly what reached this process and when.
Everything else is the application as deployed (``contextlab.asgi``).
"""

from __future__ import annotations

import time
from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.routing import URLRouter
from django.urls import path

from contextlab.asgi import application as deployed
from contextlab.support.live import remember_loop, session_group


class ProbeConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    async def connect(self) -> None:
        remember_loop()
        self.group = session_group(self.scope["url_route"]["kwargs"]["session_id"])
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        # Like the page's periodic ping: join again (memberships expire).
        if isinstance(content, dict) and content.get("type") == "ping":
            await self.channel_layer.group_add(self.group, self.channel_name)
            await self.send_json({"type": "pong"})

    async def gauge_update(self, event: dict[str, Any]) -> None:
        # When this process handed the event on: the benchmark splits the
        # latency into the server's part and the client's.
        await self.send_json({**event, "forwarded_at": time.time()})

    async def run_update(self, event: dict[str, Any]) -> None:
        await self.send_json({**event, "forwarded_at": time.time()})


probe_routes = URLRouter([path("probe/sessions/<str:session_id>/", ProbeConsumer.as_asgi())])


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "websocket" and scope["path"].startswith("/probe/"):
        await probe_routes(scope, receive, send)
    else:
        await deployed(scope, receive, send)

