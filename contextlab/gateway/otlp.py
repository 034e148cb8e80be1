"""``/otlp/v1/traces``: an OTLP/HTTP trace receiver, so an agent's own tracing feeds ContextLab.

Point an OpenTelemetry exporter at ``http(s)://<contextlab>/otlp`` with a ContextLab
API token (``OTEL_EXPORTER_OTLP_HEADERS="Authorization=Bearer <token>"``). Spans
arrive as protobuf or JSON; the LLM calls among them (GenAI conventions,
OpenInference) are recorded like the calls observe mode forwards, and each
conversation's session is rebuilt by the same inference. Other spans are ignored.
The ``X-ContextLab-Profile`` header (or the resource attribute ``contextlab.profile``)
picks the profile; else the caller's only one (``profile_observed``).

Answers follow OTLP/HTTP: an ``ExportTraceServiceResponse`` or a ``google.rpc.Status``
in the request's encoding (protobuf or JSON), gzip bodies accepted within the
body limit, and spans that cannot be read (a field of the wrong type, a lone
surrogate) rejected alone in a ``partial_success`` while the others are recorded.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import zlib
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import DecodeError
from google.rpc.status_pb2 import Status  # type: ignore[import-untyped]
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan

from contextlab.engine.core.errors import InputTooLarge, InvalidProfile, MalformedInput
from contextlab.engine.importers.json_stream import JsonSyntaxError, ParseBudget, load
from contextlab.engine.observe.otlp import Export, llm_requests, read_export
from contextlab.gateway import observe, services
from contextlab.gateway.models import UpstreamProvider
from contextlab.sessions import services as sessions

log = logging.getLogger(__name__)

PROTOBUF = "application/x-protobuf"
JSON = "application/json"

# gRPC status codes (``google.rpc.Code``) of the answers, as OTLP/HTTP's Status carries them.
INVALID_ARGUMENT, RESOURCE_EXHAUSTED, UNIMPLEMENTED, UNAVAILABLE, UNAUTHENTICATED = 3, 8, 12, 14, 16


class _Refused(Exception):
    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def too_large_message() -> str:
    limit = int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
    return (f"the export is larger than the {limit:,}-byte limit for a request body (CONTEXTLAB_MAX_BODY_BYTES); "
            "lower the batch size")


def too_large_body() -> bytes:
    """The 413 answer the body limit gives before this view runs: a ``google.rpc.Status`` in JSON."""
    return json.dumps({"code": RESOURCE_EXHAUSTED, "message": too_large_message()}).encode()


def _as_json(request: HttpRequest) -> bool:
    return (request.content_type or "") == JSON


def _answer(request: HttpRequest, rejected: list[str] | None = None) -> HttpResponse:
    """An ``ExportTraceServiceResponse`` in the request's own encoding; with ``partial_success``
    when spans were rejected, so the exporter logs why and does not send the batch again."""
    response = ExportTraceServiceResponse()
    if rejected:
        response.partial_success.rejected_spans = len(rejected)
        reasons = sorted(set(rejected))
        response.partial_success.error_message = (
            f"{len(rejected)} span(s) rejected, the others recorded: " + "; ".join(reasons[:5])
            + ("; ..." if len(reasons) > 5 else ""))[:1000]
    if _as_json(request):
        return HttpResponse(json.dumps(MessageToDict(response)), content_type=JSON)
    return HttpResponse(response.SerializeToString(), content_type=PROTOBUF)


def _refuse(request: HttpRequest, status: int, code: int, message: str) -> HttpResponse:
    """An error as OTLP/HTTP specifies it: a ``google.rpc.Status``, protobuf for a protobuf
    request, JSON otherwise."""
    if (request.content_type or "") == PROTOBUF:
        return HttpResponse(Status(code=code, message=message).SerializeToString(), status=status,
                            content_type=PROTOBUF)
    return HttpResponse(json.dumps({"code": code, "message": message}), status=status, content_type=JSON)


def decompressed(body: bytes, encoding: str, limit: int) -> bytes:
    """The body as sent before its ``Content-Encoding`` (gzip, deflate or none); at most ``limit``
    bytes, as a body sent uncompressed could be, so a small bomb costs no more than that."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding in ("gzip", "x-gzip"):
        wbits = 16 + zlib.MAX_WBITS
    elif encoding == "deflate":
        wbits = zlib.MAX_WBITS
    else:
        raise _Refused(415, INVALID_ARGUMENT, f"Content-Encoding {encoding!r} is not supported: send gzip or none")
    data = bytearray()
    rest = body
    while True:
        # Never ``max_length=0``: zlib reads that as "no limit".
        stream = zlib.decompressobj(wbits)
        try:
            data += stream.decompress(rest, limit + 1 - len(data))
        except zlib.error as exc:
            raise _Refused(400, INVALID_ARGUMENT, f"the {encoding} body is corrupt: {exc}") from exc
        if len(data) > limit or stream.unconsumed_tail:
            raise _Refused(413, RESOURCE_EXHAUSTED, _inflated(limit))
        if not stream.eof:
            raise _Refused(400, INVALID_ARGUMENT, f"the {encoding} body is cut short")
        rest = stream.unused_data
        # gzip allows several members one after the other; each is part of the body.
        if not rest or wbits == zlib.MAX_WBITS:
            return bytes(data)
        if len(data) >= limit:
            raise _Refused(413, RESOURCE_EXHAUSTED, _inflated(limit))


def _inflated(limit: int) -> str:
    return (f"the export decompresses to more than {limit:,} bytes, the limit for a request body "
            "(CONTEXTLAB_MAX_BODY_BYTES); lower the batch size")


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise DecodeError("a varint is cut short or too long")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    """The length-delimited fields of a protobuf message as (number, wire type, bytes); the others skipped."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        value = b""
        if wire == 0:
            _, pos = _varint(data, pos)
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        elif wire == 2:
            length, pos = _varint(data, pos)
            value = data[pos:pos + length]
            pos += length
        else:
            raise DecodeError(f"wire type {wire} is not one OTLP uses")
        if pos > len(data):
            raise DecodeError("a field is cut short")
        yield number, wire, value


def _span_by_span(data: bytes) -> tuple[dict[str, Any], list[str]]:
    """An export that does not parse whole (a string that is not UTF-8, such as an encoded lone
    surrogate): read span by span, so each bad span is rejected alone and the others are kept.
    A body whose structure itself is broken still raises ``DecodeError``."""
    rejected: list[str] = []
    groups: list[dict[str, Any]] = []
    for number, wire, resource_spans in _fields(data):
        if (number, wire) != (1, 2):
            continue
        resource: dict[str, Any] | None = {}
        scopes: list[dict[str, Any]] = []
        for field_number, field_wire, value in _fields(resource_spans):
            if (field_number, field_wire) == (1, 2):
                try:
                    resource = MessageToDict(Resource.FromString(value))
                except DecodeError:
                    resource = None
            elif (field_number, field_wire) == (2, 2):
                spans: list[dict[str, Any]] = []
                for span_number, span_wire, span in _fields(value):
                    if (span_number, span_wire) != (2, 2):
                        continue
                    try:
                        spans.append(MessageToDict(ProtoSpan.FromString(span)))
                    except DecodeError as exc:
                        rejected.append(f"a span is not valid protobuf ({exc})"[:200])
                scopes.append({"spans": spans})
        if resource is None:
            rejected += ["its resource is not valid protobuf"] * sum(len(s["spans"]) for s in scopes)
            continue
        groups.append({"resource": resource, "scopeSpans": scopes})
    return {"resourceSpans": groups}, rejected


def body_budget(size: int) -> ParseBudget:
    """What the JSON of one export (its body, then the JSON inside its span attributes) may take in
    memory: twice the body plus a constant, as an import's upload."""
    return ParseBudget.for_size(size, "the export's body")


def _payload(request: HttpRequest) -> tuple[dict[str, Any], list[str], ParseBudget]:
    """The export as a dict, the spans already rejected, and the budget the rest of its JSON parses within."""
    try:
        raw = request.body
    except RequestDataTooBig as exc:
        raise _Refused(413, RESOURCE_EXHAUSTED, too_large_message()) from exc
    data = decompressed(raw, request.headers.get("Content-Encoding", ""), int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE))
    del raw
    budget = body_budget(len(data))
    rejected: list[str] = []
    try:
        if _as_json(request):
            try:
                value = load(io.BytesIO(data), where="in the export", budget=budget, share=False)
            except InputTooLarge as exc:
                raise _Refused(413, RESOURCE_EXHAUSTED, exc.message) from exc
            except (JsonSyntaxError, MalformedInput) as exc:
                raise ValueError(str(exc)) from exc
            if not isinstance(value, dict):
                raise ValueError("an OTLP JSON export is an object with \"resourceSpans\"")
            return value, rejected, budget
        message = ExportTraceServiceRequest()
        try:
            message.ParseFromString(data)
            decoded: dict[str, Any] = MessageToDict(message)
        except DecodeError:
            decoded, rejected = _span_by_span(data)
    except (ValueError, DecodeError, RecursionError) as exc:
        raise _Refused(400, INVALID_ARGUMENT, f"not an OTLP trace export: {exc}"[:500]) from exc
    _hex_ids(decoded)
    return decoded, rejected, budget


def _hex_ids(decoded: dict[str, Any]) -> None:
    """Trace and span ids as OTLP/JSON writes them (hex), not as protobuf's JSON mapping does (base64)."""
    for resource_spans in decoded.get("resourceSpans") or []:
        for scope_spans in resource_spans.get("scopeSpans") or []:
            for span in scope_spans.get("spans") or []:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if isinstance(span.get(key), str):
                        span[key] = base64.b64decode(span[key]).hex()


def _record(user: Any, profile: Any, records: list[dict[str, Any]], rejected: list[str]) -> None:
    """Record the batch; when that fails, each call alone, so a call that cannot be recorded costs
    only itself (rejected, with its reason) and never the valid ones beside it."""
    try:
        observe.record_spans(owner=user, profile=profile, records=records)
        return
    except DatabaseError:
        if len(records) == 1:
            raise
        log.warning("OTLP export of %d calls could not be recorded at once; recording them one by one",
                    len(records), exc_info=True)
    for record in records:
        try:
            observe.record_spans(owner=user, profile=profile, records=[record])
        except DatabaseError as exc:
            log.warning("OTLP span %s could not be recorded: %s", record.get("span_id"), exc)
            rejected.append(f"span {record.get('span_id') or '?'}: it could not be stored ({type(exc).__name__})")


@csrf_exempt
def traces(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        response = _refuse(request, 405, UNIMPLEMENTED, "POST OTLP trace exports here")
        response["Allow"] = "POST"
        return response
    user = services.token_user(request.headers.get("Authorization", ""))
    if user is None:
        return _refuse(request, 401, UNAUTHENTICATED, "send a ContextLab API token: Authorization: Bearer <token>")
    if (request.content_type or "") not in (JSON, PROTOBUF):
        return _refuse(request, 415, INVALID_ARGUMENT, f"send OTLP as {PROTOBUF} or {JSON}")
    try:
        payload, unreadable, budget = _payload(request)
        export = read_export(payload)
        del payload
    except _Refused as exc:
        return _refuse(request, exc.status, exc.code, exc.message)
    except ValueError as exc:
        return _refuse(request, 400, INVALID_ARGUMENT, f"not an OTLP trace export: {exc}"[:500])
    rejected = [*unreadable, *export.rejected]
    # A span whose attribute JSON would pass the body's budget is rejected alone: the others are recorded.
    records = llm_requests(export.spans, rejected, budget, consume=True)
    ref = request.headers.get("X-ContextLab-Profile", "").strip()
    try:
        named = _named_profile(export)
        observing = list(UpstreamProvider.objects.filter(profile__owner=user, mode=UpstreamProvider.Mode.OBSERVE)
                         .values_list("profile_id", flat=True)[:2])
        if not ref and not named and len(observing) == 1:
            # The profile the user set up to observe an agent through the gateway.
            ref = str(observing[0])
        profile = sessions.profile_observed(owner=user, ref=ref, named=named)
    except InvalidProfile as exc:
        return _refuse(request, 400, INVALID_ARGUMENT, exc.message)
    try:
        _record(user, profile, records, rejected)
    except Exception:
        # Never an HTML page: an exporter reads this answer, and retries a 503.
        log.exception("OTLP export for user %s could not be recorded", user.pk)
        response = _refuse(request, 503, UNAVAILABLE, "the export could not be recorded now; send it again later")
        response["Retry-After"] = "5"
        return response
    return _answer(request, rejected)


# The resource attribute that names the profile an agent's spans go to, when no header does.
PROFILE_ATTRIBUTE = "contextlab.profile"


def _named_profile(export: Export) -> str:
    names = {str(span.resource.get(PROFILE_ATTRIBUTE) or "").strip() for span in export.spans}
    names.discard("")
    return names.pop() if len(names) == 1 else ""
