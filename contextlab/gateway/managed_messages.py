"""Manage mode for the Anthropic Messages API: the engine manages the context, then it goes upstream.

The shared core does the work, as for chat completions: ``services.exchange_prepare``
finds the session and runs the hook on the conversation converted to the internal
(chat) shape, ``services.exchange_record`` writes the turn once the provider
answered. This module only converts on the way in and out
(``protocols.anthropic_messages``) and relays the provider's answer, events passed
on as they arrive. A call the engine could not manage goes out as the agent sent it.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx2
from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse

from contextlab import telemetry
from contextlab.engine.provider_edits import provider_edits_step
from contextlab.gateway import history, services, upstream
from contextlab.gateway.credentials import ClientCredential
from contextlab.gateway.models import UpstreamProvider
from contextlab.gateway.protocols import anthropic_messages as wire_protocol
from contextlab.gateway.services import SESSION_HEADER, Exchange
from contextlab.sessions.models import AgentProfile, Turn

WIRE = wire_protocol.MESSAGES


def _context_headers(response: HttpResponseBase, exchange: Exchange) -> None:
    response["X-ContextLab-Managed"] = "true" if exchange.managed else "false"
    if exchange.session is not None:
        response[SESSION_HEADER] = str(exchange.session.pk)
    if exchange.turn is not None:
        response["X-ContextLab-Turn"] = str(exchange.turn)


def upstream_body(request: HttpRequest, provider: UpstreamProvider, body: dict[str, Any],
                  exchange: Exchange) -> bytes:
    """What goes upstream: the managed messages in Anthropic's shape, every other field as it came.

    Unmanaged, the agent's bytes go as they came unless the model name is mapped."""
    model = provider.upstream_model(body.get("model"))
    if not exchange.managed:
        if model == body.get("model"):
            return request.body
        return _dumps({**body, "model": model})
    chat = exchange.body.get("messages") or []
    _, payload = history.split_system(chat)
    return _dumps({**body, "model": model, "messages": wire_protocol.from_chat(payload, body.get("messages"))})


def _dumps(body: dict[str, Any]) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")


def call(request: HttpRequest, *, owner: User, profile: AgentProfile, provider: UpstreamProvider, api_key: str,
         body: dict[str, Any], session_header: str, credential: ClientCredential | None,
         for_server: Callable[[Iterator[bytes]], Iterator[bytes] | AsyncIterator[bytes]],
         retry: bool = False) -> HttpResponseBase:
    stream = body.get("stream") is True
    span = telemetry.start_gateway_span(request.headers, model=str(body.get("model") or "")[:200], stream=stream)
    with telemetry.current(span):
        exchange = services.exchange_prepare(owner=owner, profile=profile, provider=provider,
                                             body=wire_protocol.to_chat(body, thinking_text=False),
                                             session_header=session_header, retry=retry,
                                             endpoint=wire_protocol.ENDPOINT)
    exchange.span = span
    exchange.stream = stream
    data = upstream_body(request, provider, body, exchange)
    start = time.perf_counter()
    http = upstream.client()
    try:
        outgoing = http.build_request(
            "POST", WIRE.url(provider, request), content=data,
            headers={**WIRE.headers(provider, api_key, credential, request, stream=stream),
                     **telemetry.upstream_trace_headers(request.headers, span)},
            timeout=upstream._timeout(provider))
        answer = http.send(outgoing, stream=stream)
    except httpx2.TimeoutException as exc:
        return _unreachable(exchange, start, 504, f"the upstream provider did not answer within "
                                                  f"{provider.timeout:g} s ({type(exc).__name__})")
    except httpx2.RequestError as exc:
        return _unreachable(exchange, start, 502, f"the upstream provider could not be reached: "
                                                  f"{type(exc).__name__}: {exc}")
    if stream and answer.status_code == 200:
        streaming = StreamingHttpResponse(for_server(_relay(answer, exchange, start)), status=200,
                                         content_type=answer.headers.get("content-type", "text/event-stream"))
        for name, value in WIRE.passed(answer).items():
            if name.lower() != "content-type":
                streaming[name] = value
        streaming["Cache-Control"] = "no-cache"
        streaming["X-Accel-Buffering"] = "no"
        _context_headers(streaming, exchange)
        return streaming
    try:
        content = answer.read()
    except httpx2.HTTPError as exc:
        return _unreachable(exchange, start, 502, f"the upstream answer broke off: {exc}")
    finally:
        answer.close()
    reply = wire_protocol.reply_from_body(content) if answer.status_code == 200 else None
    message = _message(content) if answer.status_code == 200 else None
    row = services.exchange_record(exchange, status_code=answer.status_code,
                                   reply=wire_protocol.reply_to_chat(message) if message is not None else None,
                                   usage=reply.usage if reply is not None else None,
                                   upstream_ms=(time.perf_counter() - start) * 1000)
    if row is not None and not row.error:
        _note_provider_edits(exchange, reply.context_management if reply is not None else None)
    response = upstream.passthrough(answer, content)
    for name, value in WIRE.passed(answer).items():
        response[name] = value
    _context_headers(response, exchange)
    return response


def _message(content: bytes) -> dict[str, Any] | None:
    try:
        data = json.loads(content)
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) and data.get("type") == "message" else None


def _unreachable(exchange: Exchange, start: float, status: int, message: str) -> HttpResponse:
    services.exchange_record(exchange, status_code=status, upstream_ms=(time.perf_counter() - start) * 1000,
                             error=message)
    response = wire_protocol.error_response(status, message)
    _context_headers(response, exchange)
    return response


def _relay(answer: httpx2.Response, exchange: Exchange, start: float) -> Iterator[bytes]:
    """The provider's events, passed on as they arrive; the reply is recorded before the chunk
    holding ``message_stop`` goes out, so the agent's next call finds it in the session."""
    builder = wire_protocol.StreamBuilder()
    pending = b""
    recorded = False
    error = ""
    try:
        for chunk in answer.iter_bytes():
            pending += chunk
            *complete, pending = pending.split(b"\n")
            for line in complete:
                line = line.rstrip(b"\r")
                if line.startswith(b"data:"):
                    wire_protocol.stream_events([line[5:].strip()], builder)
            if builder.finished and not recorded:
                _record_stream(exchange, builder, start, "")
                recorded = True
            yield chunk
    except GeneratorExit:
        error = "the client went away before the stream ended"
        raise
    except httpx2.HTTPError as exc:
        error = f"the upstream stream broke off: {type(exc).__name__}: {exc}"
    finally:
        answer.close()
        if not recorded:
            _record_stream(exchange, builder, start, error)
    if not recorded and not builder.finished:
        yield wire_protocol.error_event(error or "the upstream stream ended before message_stop")


def _record_stream(exchange: Exchange, builder: wire_protocol.StreamBuilder, start: float, error: str) -> None:
    if not error and builder.error:
        error = f"the upstream sent an error event: {builder.error}"
    if not error and not builder.complete:
        error = "the stream ended before message_stop"
    message = builder.result()
    row = services.exchange_record(exchange, status_code=200,
                                   reply=wire_protocol.reply_to_chat(message) if not error else None,
                                   usage=builder.usage or None, upstream_ms=(time.perf_counter() - start) * 1000,
                                   error=error)
    if row is not None and not row.error:
        _note_provider_edits(exchange, message.get("context_management"))


def _note_provider_edits(exchange: Exchange, applied: Any) -> None:
    """The provider's own context edits (asked for, applied) as a step of the turn's decision flow.

    Written after the turn: the engine's trace is complete by then, and the
    applied edits are only known from the answer."""
    asked = exchange.body.get("context_management")
    step = provider_edits_step((asked or {}).get("edits") if isinstance(asked, dict) else None,
                               applied.get("applied_edits") if isinstance(applied, dict) else None)
    if step is None or exchange.session is None or exchange.turn is None or not exchange.managed:
        return
    turn = Turn.objects.filter(session=exchange.session, number=exchange.turn).only("pk", "trace").first()
    if turn is None or not isinstance(turn.trace, dict):
        return
    steps = [s for s in turn.trace.get("steps") or [] if s.get("step") != step["step"]]
    result_at = next((i for i, s in enumerate(steps) if s.get("step") == "result"), len(steps))
    steps.insert(result_at, step)
    turn.trace = {**turn.trace, "steps": steps}
    turn.save(update_fields=["trace"])
