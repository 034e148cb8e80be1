from __future__ import annotations

import json

from django.apps import AppConfig

TOO_LARGE = "the request body is larger than this server accepts"


class GatewayConfig(AppConfig):
    name = "contextlab.gateway"
    label = "gateway"
    verbose_name = "OpenAI-compatible gateway"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from contextlab.core import bodylimit
        from contextlab.gateway import otlp
        from contextlab.gateway.protocols import anthropic_messages, openai_responses

        # The server refuses an oversized body before any view runs: the agents' SDKs then read
        # the refusal in their provider's error shape, as every other error of these endpoints.
        anthropic = json.dumps(anthropic_messages.error_body(413, TOO_LARGE)).encode()
        openai = json.dumps(openai_responses.error_body(TOO_LARGE, code="request_too_large")).encode()
        bodylimit.REFUSAL_BODIES.update({
            "cl-gateway-anthropic-messages": anthropic, "cl-gateway-anthropic-count-tokens": anthropic,
            "cl-gateway-responses": openai, "cl-gateway-responses-compact": openai, "cl-gateway-chat": openai,
            # An OTLP exporter reads a google.rpc.Status: RESOURCE_EXHAUSTED, naming the limit.
            "cl-otlp-traces": otlp.too_large_body,
        })
