"""``/otlp/v1/traces``: an OTLP/HTTP trace receiver, so an agent's own tracing feeds ContextLab.

Point an OpenTelemetry exporter at ``http(s)://<contextlab>/otlp`` with a ContextLab
API token (``OTEL_EXPORTER_OTLP_HEADERS="Authorization=Bearer <token>"``). Spans
arrive as protobuf or JSON; the LLM calls among them (GenAI conventions,
OpenInference) are recorded like the calls observe mode forwards, and each
conversation's session is rebuilt by the same inference. Other spans are ignored.
The ``X-ContextLab-Profile`` header picks the profile; else the caller's default.
"""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from contextlab.engine.errors import InvalidProfile
from contextlab.engine.otlp import llm_requests, spans_from_json
from contextlab.gateway import observe, services
from contextlab.sessions import services as sessions

log = logging.getLogger(__name__)

PROTOBUF = "application/x-protobuf"


def _answer(request: HttpRequest, status: int = 200, message: str = "") -> HttpResponse:
    """An OTLP answer in the request's own encoding; an error carries a ``google.rpc.Status``-shaped body."""
    as_json = (request.content_type or "") == "application/json"
    if status == 200:
        if as_json:
            return HttpResponse(b"{}", content_type="application/json")
        return HttpResponse(ExportTraceServiceResponse().SerializeToString(), content_type=PROTOBUF)
    return HttpResponse(json.dumps({"code": status, "message": message}), status=status,
                        content_type="application/json")


def _payload(request: HttpRequest) -> dict[str, Any]:
    if (request.content_type or "") == "application/json":
        value = json.loads(request.body)
        if not isinstance(value, dict):
            raise ValueError("an OTLP JSON export is an object with \"resourceSpans\"")
        return value
    message = ExportTraceServiceRequest()
    message.ParseFromString(request.body)
    decoded: dict[str, Any] = MessageToDict(message)
    _hex_ids(decoded)
    return decoded


def _hex_ids(decoded: dict[str, Any]) -> None:
    """Trace and span ids as OTLP/JSON writes them (hex), not as protobuf's JSON mapping does (base64)."""
    for resource_spans in decoded.get("resourceSpans") or []:
        for scope_spans in resource_spans.get("scopeSpans") or []:
            for span in scope_spans.get("spans") or []:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if isinstance(span.get(key), str):
                        span[key] = base64.b64decode(span[key]).hex()


@csrf_exempt
def traces(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        response = _answer(request, 405, "POST OTLP trace exports here")
        response["Allow"] = "POST"
        return response
    user = services.token_user(request.headers.get("Authorization", ""))
    if user is None:
        return _answer(request, 401, "send a ContextLab API token: Authorization: Bearer <token>")
    if (request.content_type or "") not in ("application/json", PROTOBUF):
        return _answer(request, 415, f"send OTLP as {PROTOBUF} or application/json")
    try:
        payload = _payload(request)
        records = llm_requests(spans_from_json(payload))
    except RequestDataTooBig:
        return _answer(request, 413, "the export is larger than this server accepts; lower the batch size")
    except (ValueError, DecodeError, RecursionError) as exc:
        return _answer(request, 400, f"not an OTLP trace export: {exc}"[:500])
    ref = request.headers.get("X-ContextLab-Profile", "").strip()
    try:
        profile = (sessions.profile_resolve(owner=user, ref=ref) if ref else sessions.profile_default(owner=user))
    except InvalidProfile as exc:
        return _answer(request, 400, exc.message)
    observe.record_spans(owner=user, profile=profile, records=records)
    return _answer(request)
