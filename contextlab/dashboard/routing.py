from __future__ import annotations

from django.urls import path

from contextlab.dashboard import consumers

websocket_urlpatterns = [
    path("ws/sessions/<uuid:session_id>/", consumers.SessionConsumer.as_asgi()),
]
