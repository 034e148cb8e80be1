"""Manage mode for the Responses API: the engine manages what the request carries, then it goes upstream.

The request's items are read as chat messages (``protocols.openai_responses``),
the shared exchange core finds the session and runs the hook on them, and the
managed messages go back upstream as the request's own items: kept ones
verbatim (reasoning with its ``encrypted_content``, a call with its output),
shortened tool outputs with the engine's text, the summary as a user message
item. The provider's answer (or its events, relayed as they arrive) comes back
unchanged and its reply joins the session, as for chat completions.

Requests the engine must not manage go out as they came, recorded with the
reason: the agent's own compaction requests and cache warm-ups. A request that
continues ``previous_response_id`` is managed for what it carries (the
provider holds the conversation before it): its items join the session that
recorded that response when the gateway forwarded it, and only they go
upstream.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx2
from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse, HttpResponseBase

from contextlab.gateway import observe, services, upstream
from contextlab.gateway.credentials import ClientCredential
from contextlab.gateway.models import UpstreamProvider
from contextlab.gateway.protocols import openai_responses
from contextlab.gateway.services import SESSION_HEADER, Exchange
from contextlab.sessions.models import AgentProfile, AgentSession
from contextlab.support import telemetry

REMOTE_COMPACTION = ("the agent asked the provider to compact its conversation (remote compaction): "
                     "forwarded as it came")
LOCAL_COMPACTION = "the agent's own compaction request (its summary prompt, no tools): forwarded as it came"
AFTER_COMPACTION = ("the agent compacted its own context just before this request ({kind}): what it sent replaced "
                    "the managed context, and the session goes on")


def _unmanaged_reason(body: dict[str, Any], kind: str, wire: observe.ResponsesWire) -> str:
    if wire.endpoint == openai_responses.COMPACT_ENDPOINT or kind == "compaction.remote":
        return REMOTE_COMPACTION
    if kind == "compaction.local":
        return LOCAL_COMPACTION
    if kind == "prewarm":
        return "the agent's cache warm-up request: forwarded as it came"
    return ""


def _continued(previous: str, session: AgentSession | None) -> str:
    if session is not None:
        return (f"the request continues response {previous[:100]}, which this session recorded: the provider holds "
                "the conversation before it, so ContextLab managed only what the request carries")
    return (f"the request continues response {previous[:100]}, which ContextLab never forwarded (the chain starts "
            "outside ContextLab): the provider holds the conversation before it, so ContextLab managed only what "
            "the request carries")


def call(request: HttpRequest, *, owner: User, profile: AgentProfile, provider: UpstreamProvider, api_key: str,
         body: dict[str, Any], session_header: str, wire: observe.ResponsesWire, kind: str, retry: bool,
         for_server: Callable[[Iterator[bytes]], Iterator[bytes] | AsyncIterator[bytes]],
         credential: ClientCredential | None = None) -> HttpResponseBase:
    # Named conversations (Codex's thread) are read incrementally: only the items new since its last call.
    view = openai_responses.manage_view(body, (owner.pk, profile.pk, session_header) if session_header else None)
    reason = _unmanaged_reason(body, kind, wire)
    same_bytes: bytes | None = None
    model = provider.upstream_model(body.get("model")) if "model" in body else None
    if reason:
        exchange = Exchange(owner=owner, profile=profile, provider=provider, body={**body, "model": model},
                            stream=body.get("stream") is True, model=str(body.get("model") or "")[:200],
                            endpoint=wire.endpoint)
        exchange.notes.append(reason)
        # The session the agent names, when the gateway has one: the row (and its reason) shows there.
        exchange.session = services.named_session(owner, profile, session_header)
    else:
        compaction = openai_responses.agent_compaction(body)
        previous = openai_responses.previous_response(body)
        chained_to = services.session_of_response(owner, profile, previous) if previous else None
        exchange = services.exchange_prepare(owner=owner, profile=profile, provider=provider, body=view.chat,
                                             session_header=session_header, retry=retry,
                                             agent_compaction=compaction, chained_to=chained_to)
        exchange.endpoint = wire.endpoint
        if exchange.identity == "compacted" and compaction is not None:
            exchange.notes.append(AFTER_COMPACTION.format(kind=compaction.kind))
        if previous:
            exchange.notes.append(_continued(previous, chained_to))
        unknown = services.unknown_content_step(openai_responses.unknown_types(body))
        if unknown is not None:
            exchange.steps.append(unknown)
        if exchange.managed:
            managed = list(exchange.body["messages"])
            if previous:
                # Upstream goes only what the request carried, as the engine left it: the provider
                # adds the conversation it holds, and the session's earlier messages are in it.
                carried = len(view.sourced)
                head = managed[:1] if view.has_system and managed else []
                managed = [*head, *(managed[len(head):][-carried:] if carried else [])]
                exchange.upstream_messages = len(managed)
            if managed == view.chat["messages"] and model == body.get("model"):
                # The engine kept the whole request as it came (the common case): the agent's
                # bytes go as they are, with no conversion back into items and no re-encoding.
                exchange.body, same_bytes = dict(body), request.body
            else:
                exchange.body = view.body(body, managed, model)
        else:
            exchange.body = {**body, "model": model} if "model" in body else dict(body)
    span = telemetry.start_gateway_span(request.headers, model=exchange.model, stream=exchange.stream)
    exchange.span = span
    start = time.perf_counter()
    try:
        answer = upstream.post(provider, api_key, wire.path, exchange.body, stream=exchange.stream,
                               trace_headers=telemetry.upstream_trace_headers(request.headers, span),
                               credential=(credential.header, credential.value) if credential is not None else None,
                               content=same_bytes)
    except httpx2.TimeoutException as exc:
        return _unreachable(exchange, start, 504, f"the upstream provider did not answer within "
                                                  f"{provider.timeout:g} s ({type(exc).__name__})", "upstream_timeout")
    except httpx2.RequestError as exc:
        return _unreachable(exchange, start, 502, f"the upstream provider could not be reached: "
                                                  f"{type(exc).__name__}: {exc}", "upstream_unreachable")
    if exchange.stream and answer.status_code == 200:
        streaming = upstream.event_stream(answer, for_server(_relay(answer, exchange, start)),
                                          upstream.passed_headers(answer))
        _context_headers(streaming, exchange)
        return streaming
    try:
        content = answer.read()
    except httpx2.HTTPError as exc:
        return _unreachable(exchange, start, 502, f"the upstream answer broke off: {exc}", "upstream_unreachable")
    finally:
        answer.close()
    parsed = openai_responses.answer_of(content) if answer.status_code == 200 else None
    error = parsed.error if parsed is not None and parsed.error else ""
    exchange.response_id = parsed.response_id if parsed is not None else ""
    services.exchange_record(exchange, status_code=answer.status_code,
                             reply=openai_responses.reply_message(parsed) if parsed and not error else None,
                             usage=parsed.usage if parsed else None,
                             upstream_ms=(time.perf_counter() - start) * 1000, error=error)
    response = upstream.passthrough(answer, content)
    _context_headers(response, exchange)
    return response


def _context_headers(response: HttpResponseBase, exchange: Exchange) -> None:
    response["X-ContextLab-Managed"] = "true" if exchange.managed else "false"
    if exchange.session is not None:
        response[SESSION_HEADER] = str(exchange.session.pk)
    if exchange.turn is not None:
        response["X-ContextLab-Turn"] = str(exchange.turn)


def _unreachable(exchange: Exchange, start: float, status: int, message: str, code: str) -> HttpResponse:
    services.exchange_record(exchange, status_code=status, upstream_ms=(time.perf_counter() - start) * 1000,
                             error=message)
    response = upstream.openai_error(status, message, type="server_error", code=code)
    _context_headers(response, exchange)
    return response


def _relay(answer: httpx2.Response, exchange: Exchange, start: float) -> Iterator[bytes]:
    """The provider's events as they arrive; the reply is recorded before the terminal event goes out."""
    reader = openai_responses.StreamReader()
    pending = b""
    recorded = False
    error = ""

    def record(error: str) -> None:
        done = reader.answer
        exchange.response_id = done.response_id
        failed = error or (done.error if reader.finished else "") or (
            "" if reader.complete else "the stream ended before the response was complete")
        services.exchange_record(exchange, status_code=200,
                                 reply=openai_responses.reply_message(done) if not failed else None,
                                 usage=done.usage, upstream_ms=(time.perf_counter() - start) * 1000, error=failed)

    try:
        for chunk in answer.iter_bytes():
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                line = line.rstrip(b"\r")
                if line.startswith(b"data:"):
                    reader.feed(line[5:].strip())
            if reader.finished and not recorded:
                record("")
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
            record(error)
    if not recorded and not reader.finished:
        # Too late for a status code: an error event the SDKs and Codex raise on, so they retry.
        yield openai_responses.error_event(error or "the upstream stream ended before the response was complete",
                                           code="upstream_stream_broken")
