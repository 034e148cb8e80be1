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
from django.http import HttpRequest, HttpResponse, HttpResponseBase

from contextlab.engine.core.tokens import TiktokenCounter
from contextlab.engine.observe.provider_edits import provider_edits_step
from contextlab.gateway import history, services, upstream
from contextlab.gateway.credentials import ClientCredential
from contextlab.gateway.models import UpstreamProvider
from contextlab.gateway.protocols import anthropic_messages as wire_protocol
from contextlab.gateway.services import SESSION_HEADER, Exchange
from contextlab.sessions.models import AgentProfile
from contextlab.support import telemetry

WIRE = wire_protocol.MESSAGES
COMPACTION_REQUEST = "Claude Code's own compaction request (its summary prompt): forwarded as it came"
AFTER_COMPACTION = ("Claude Code compacted its own context just before this request: what it sent replaced the "
                    "managed context, and the session goes on")


def _context_headers(response: HttpResponseBase, exchange: Exchange) -> None:
    response["X-ContextLab-Managed"] = "true" if exchange.managed else "false"
    if exchange.session is not None:
        response[SESSION_HEADER] = str(exchange.session.pk)
    if exchange.turn is not None:
        response["X-ContextLab-Turn"] = str(exchange.turn)


def upstream_body(request: HttpRequest, provider: UpstreamProvider, body: dict[str, Any],
                  exchange: Exchange) -> tuple[bytes, wire_protocol.AppliedEdits | None]:
    """What goes upstream: the managed messages in Anthropic's shape, every other field as it came;
    and the context edits ContextLab ran itself, when the provider is set to have it run them.

    Unmanaged, the agent's bytes go as they came unless the model name is mapped."""
    model = provider.upstream_model(body.get("model"))
    if not exchange.managed:
        if model == body.get("model"):
            return request.body, None
        return _dumps({**body, "model": model}), None
    chat = exchange.body.get("messages") or []
    _, payload = history.split_system(chat)
    edits = wire_protocol.context_edits(body)
    by_engine = bool(edits) and provider.context_edits == UpstreamProvider.ContextEdits.ENGINE
    if payload == exchange.rest and not by_engine:
        # The engine kept the whole conversation as it came (the common case): the agent's
        # bytes go as they are, with no conversion back and no re-encoding.
        return (request.body if model == body.get("model") else _dumps({**body, "model": model})), None
    messages = wire_protocol.from_chat(payload, body.get("messages"))
    if not by_engine:
        return _dumps({**body, "model": model, "messages": messages}), None
    tokens = exchange.pending.trace["payload"]["tokens"]["total"] if exchange.pending is not None else 0
    applied = wire_protocol.apply_context_edits(messages, edits, input_tokens=int(tokens),
                                                count=TiktokenCounter().count_text)
    out = {key: value for key, value in body.items() if key != "context_management"}
    return _dumps({**out, "model": model, "messages": applied.messages}), applied


def _dumps(body: dict[str, Any]) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")


def call(request: HttpRequest, *, owner: User, profile: AgentProfile, provider: UpstreamProvider, api_key: str,
         body: dict[str, Any], session_header: str, credential: ClientCredential | None,
         for_server: Callable[[Iterator[bytes]], Iterator[bytes] | AsyncIterator[bytes]],
         retry: bool = False) -> HttpResponseBase:
    stream = body.get("stream") is True
    span = telemetry.start_gateway_span(request.headers, model=str(body.get("model") or "")[:200], stream=stream)
    if wire_protocol.is_compaction_request(body):
        # Claude Code asks the model for its own summary: the request goes as it came (managing it
        # would summarise what the engine already shortened), shown in the session it compacts.
        exchange = Exchange(owner=owner, profile=profile, provider=provider,
                            body={**body, "model": provider.upstream_model(body.get("model"))}, stream=stream,
                            model=str(body.get("model") or "")[:200], endpoint=wire_protocol.ENDPOINT)
        exchange.notes.append(COMPACTION_REQUEST)
        exchange.session = services.named_session(owner, profile, session_header)
    else:
        compaction = wire_protocol.agent_compaction(body)
        with telemetry.current(span):
            exchange = services.exchange_prepare(owner=owner, profile=profile, provider=provider,
                                                 body=wire_protocol.to_chat(
                                                     body, thinking_text=False,
                                                     conversation=(owner.pk, profile.pk, session_header)
                                                     if session_header else None),
                                                 session_header=session_header, retry=retry,
                                                 endpoint=wire_protocol.ENDPOINT, agent_compaction=compaction)
        if exchange.identity == "compacted":
            exchange.notes.append(AFTER_COMPACTION)
        unknown = services.unknown_content_step(wire_protocol.unknown_types(body))
        if unknown is not None:
            exchange.steps.append(unknown)
    exchange.span = span
    exchange.stream = stream
    data, applied = upstream_body(request, provider, body, exchange)
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
        streaming = upstream.event_stream(answer, for_server(_relay(answer, exchange, start, applied)),
                                          WIRE.passed(answer))
        _context_headers(streaming, exchange)
        return streaming
    try:
        content = answer.read()
    except httpx2.HTTPError as exc:
        return _unreachable(exchange, start, 502, f"the upstream answer broke off: {exc}")
    finally:
        answer.close()
    message = _message(content) if answer.status_code == 200 else None
    if message is not None and applied is not None:
        # Answered as Anthropic answers the edits it applied itself.
        message = wire_protocol.with_context_management(message, applied.applied)
        content = _dumps(message)
    reply = wire_protocol.reply_of(message) if message is not None else None
    row = services.exchange_record(exchange, status_code=answer.status_code,
                                   reply=wire_protocol.reply_to_chat(message) if message is not None else None,
                                   usage=reply.usage if reply is not None else None,
                                   upstream_ms=(time.perf_counter() - start) * 1000)
    # Notes (an agent compaction adopted) are no failure: only an error skips the step.
    if row is not None and not exchange.error:
        _note_provider_edits(exchange, reply.context_management if reply is not None else None, applied)
    response = upstream.passthrough(answer, content, extra=WIRE.passed(answer),
                                    not_json=wire_protocol.error_response)
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


def _relay(answer: httpx2.Response, exchange: Exchange, start: float,
           applied: wire_protocol.AppliedEdits | None = None) -> Iterator[bytes]:
    """The provider's events, passed on as they arrive; the reply is recorded before the chunk
    holding ``message_stop`` goes out, so the agent's next call finds it in the session.

    With ``applied`` (ContextLab ran the request's context edits), ``message_delta`` carries
    them as ``context_management``, where Anthropic reports its own."""
    builder = wire_protocol.StreamBuilder()
    pending = b""
    recorded = False
    error = ""
    try:
        for chunk in answer.iter_bytes():
            pending += chunk
            *complete, pending = pending.split(b"\n")
            for position, line in enumerate(complete):
                line = line.rstrip(b"\r")
                if line.startswith(b"data:"):
                    wire_protocol.stream_events([line[5:].strip()], builder)
                    if applied is not None and b'"message_delta"' in line:
                        complete[position] = _with_edits(line, applied)
            if builder.finished and not recorded:
                _record_stream(exchange, builder, start, "", applied)
                recorded = True
            if applied is None:
                yield chunk
            elif complete:
                # Whole lines only: one of them may have changed.
                yield b"\n".join(complete) + b"\n"
        if applied is not None and pending:
            yield pending
    except GeneratorExit:
        error = "the client went away before the stream ended"
        raise
    except httpx2.HTTPError as exc:
        error = f"the upstream stream broke off: {type(exc).__name__}: {exc}"
    finally:
        answer.close()
        if not recorded:
            _record_stream(exchange, builder, start, error, applied)
    if not recorded and not builder.finished:
        yield wire_protocol.error_event(error or "the upstream stream ended before message_stop")


def _with_edits(line: bytes, applied: wire_protocol.AppliedEdits) -> bytes:
    try:
        event = json.loads(line[5:].strip())
    except ValueError:
        return line
    if not isinstance(event, dict) or event.get("type") != "message_delta":
        return line
    event["context_management"] = {"applied_edits": applied.applied}
    return b"data: " + _dumps(event)


def _record_stream(exchange: Exchange, builder: wire_protocol.StreamBuilder, start: float, error: str,
                   applied: wire_protocol.AppliedEdits | None = None) -> None:
    if not error and builder.error:
        error = f"the upstream sent an error event: {builder.error}"
    if not error and not builder.complete:
        error = "the stream ended before message_stop"
    message = builder.result()
    row = services.exchange_record(exchange, status_code=200,
                                   reply=wire_protocol.reply_to_chat(message) if not error else None,
                                   usage=builder.usage or None, upstream_ms=(time.perf_counter() - start) * 1000,
                                   error=error)
    # Notes (an agent compaction adopted) are no failure: only an error skips the step.
    if row is not None and not exchange.error:
        _note_provider_edits(exchange, message.get("context_management"), applied)


def _note_provider_edits(exchange: Exchange, answered: Any, applied: wire_protocol.AppliedEdits | None) -> None:
    """The context edits (asked for, applied by the provider or by ContextLab) as a step of the
    turn's decision flow.

    Written after the turn: the engine's trace is complete by then, and the
    provider's applied edits are only known from the answer."""
    asked = exchange.body.get("context_management")
    step = provider_edits_step(
        (asked or {}).get("edits") if isinstance(asked, dict) else None,
        applied.applied if applied is not None else (
            answered.get("applied_edits") if isinstance(answered, dict) else None),
        removed=applied.removed if applied is not None else None,
        by="ContextLab" if applied is not None else "the provider")
    if step is not None and exchange.managed:
        services.turn_step_add(exchange, step)
