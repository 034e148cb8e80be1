from __future__ import annotations

from django.urls import path, re_path

from contextlab.gateway import views

urlpatterns = [
    path("chat/completions", views.chat_completions, name="cl-gateway-chat"),
    path("responses", views.responses, name="cl-gateway-responses"),
    path("responses/compact", views.responses_compact, name="cl-gateway-responses-compact"),
    # The Anthropic Messages API (Claude Code sends ``?beta=true``; the query goes upstream as it came).
    path("messages", views.anthropic_messages_view, name="cl-gateway-anthropic-messages"),
    path("messages/count_tokens", views.anthropic_count_tokens_view, name="cl-gateway-anthropic-count-tokens"),
    path("models", views.models, name="cl-gateway-models"),
    path("models/<path:model>", views.model_detail, name="cl-gateway-model"),
    # Anything else under /v1/ answers in OpenAI's error shape, not the HTML 404 page.
    re_path(r"^(?P<rest>.*)$", views.not_found),
]
