"""``/v1/``: the OpenAI-compatible endpoints an unmodified agent points its client at.

Views are synchronous: the sessions services they call are synchronous and
transactional, and the provider call holds no lock. A streamed answer is a
generator under WSGI; under ASGI (Daphne) Django would drain a synchronous
iterator completely before sending the first byte, so there it is wrapped in an
async iterator that pulls each event in the request's own thread.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx2
from asgiref.sync import sync_to_async
from django.core.exceptions import RequestDataTooBig
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.views.decorators.csrf import csrf_exempt

from contextlab.engine.core import strict_json
from contextlab.engine.core.unicode import repaired
from contextlab.gateway import (
    credentials,
    managed_messages,
    observe,
    responses_managed,
    services,
    sse,
    upstream,
)
from contextlab.gateway.models import UpstreamProvider
from contextlab.gateway.protocols import anthropic_messages, openai_responses
from contextlab.gateway.services import PROFILE_HEADER, SESSION_HEADER, Exchange, GatewayError
from contextlab.sessions.models import AgentProfile
from contextlab.support import ratelimit, telemetry

log = logging.getLogger(__name__)


def _error(exc: GatewayError) -> HttpResponse:
    return upstream.openai_error(exc.status, exc.message, type=exc.type, code=exc.code, param=exc.param)


def _unauthorized() -> HttpResponse:
    response = upstream.openai_error(
        401, "Incorrect API key provided: use a ContextLab API token as the OpenAI API key "
             "(manage.py createapitoken).", code="invalid_api_key")
    response["WWW-Authenticate"] = 'Bearer realm="contextlab"'
    return response


def _rate_limited(retry_after: int) -> HttpResponse:
    limit = ratelimit.limit_for("gateway")
    assert limit is not None
    response = upstream.openai_error(
        429, f"Rate limit reached for this ContextLab token: {limit.requests} requests per {limit.seconds} s. "
             f"Please try again in {retry_after} s.", type="requests", code="rate_limit_exceeded")
    response["Retry-After"] = str(retry_after)
    return response


def _method_not_allowed(allowed: str) -> HttpResponse:
    response = upstream.openai_error(405, f"use {allowed} here", code="method_not_allowed")
    response["Allow"] = allowed
    return response


def _json_body(request: HttpRequest) -> dict[str, Any]:
    try:
        # Refused in both modes, before anything is forwarded or recorded: the
        # provider would refuse them too, and a call record holding one could
        # not be stored (it would vanish from the session after a 200).
        value = strict_json.loads(request.body)
    except RequestDataTooBig as exc:
        raise GatewayError(413, "the request body is larger than this server accepts",
                           code="request_too_large") from exc
    except strict_json.NonFiniteNumber as exc:
        raise GatewayError(400, f"the request body is not valid JSON: {exc}", code="invalid_number",
                           param=exc.path) from exc
    except (ValueError, RecursionError) as exc:
        raise GatewayError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(value, dict):
        raise GatewayError(400, "the request body must be a JSON object", code="invalid_json")
    # An agent resends its whole history every call, so refusing a lone
    # surrogate would wedge it for good: it becomes U+FFFD instead. Only a body
    # that can hold one is walked: the walk costs about what the parse does.
    return dict(repaired(value)) if _may_hold_surrogates(request.body) else value


# What decodes to a lone surrogate: a \ud800-\udfff escape, or the UTF-8-style
# bytes of one (``json.loads`` decodes bytes with "surrogatepass").
_MAYBE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")


def _may_hold_surrogates(raw: bytes) -> bool:
    # A UTF-16 or UTF-32 body (JSON allows them; zero bytes or a byte order
    # mark at the start) is not checked byte-wise: it is always walked.
    if b"\x00" in raw[:4] or raw[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return True
    # Plain substring searches first (memchr speed, a tenth of the regex's time on
    # a large body); the regex runs only on a body that holds one of its prefixes.
    if b"\\ud" not in raw and b"\\uD" not in raw and b"\xed" not in raw:
        return False
    return _MAYBE_SURROGATE.search(raw) is not None


def _may_hold_nonfinite(raw: bytes) -> bool:
    # ``json.loads`` reads NaN and Infinity as floats; the fast encoder would
    # write them as null. A body without those words cannot hold one.
    return b"NaN" in raw or b"Infinity" in raw


def _is_retry(request: HttpRequest) -> bool:
    """The OpenAI SDKs (Python, JavaScript) count their retries in this header; 0 is a first attempt."""
    count = request.headers.get("X-Stainless-Retry-Count", "").strip()
    return count.isdigit() and int(count) > 0


def _context_headers(response: HttpResponseBase, exchange: Exchange) -> None:
    # Lets a client that cares find its session page; unmodified clients ignore it.
    response["X-ContextLab-Managed"] = "true" if exchange.managed else "false"
    if exchange.session is not None:
        response[SESSION_HEADER] = str(exchange.session.pk)
    if exchange.turn is not None:
        response["X-ContextLab-Turn"] = str(exchange.turn)


@csrf_exempt
def chat_completions(request: HttpRequest) -> HttpResponseBase:
    if request.method != "POST":
        return _method_not_allowed("POST")
    caller, refusal = _gateway_caller(request)
    if refusal is not None:
        return refusal
    assert caller is not None and caller.token is not None
    user = caller.token.user
    parsing = time.perf_counter()
    try:
        body = _json_body(request)
        parse_ms = (time.perf_counter() - parsing) * 1000
        session_header = request.headers.get(SESSION_HEADER, "").strip()
        profile = services.profile_for(owner=user, session_header=session_header,
                                       profile_header=request.headers.get(PROFILE_HEADER, "").strip())
        provider, api_key = services.provider_for(profile)
    except GatewayError as exc:
        return _error(exc)
    credential, refusal = _openai_credential(caller, profile, provider)
    if refusal is not None:
        return refusal
    if observe.is_observed(provider):
        return observe.forward(request, owner=user, profile=profile, provider=provider, api_key=api_key, body=body,
                               session_header=session_header, for_server=lambda it: _for_server(request, it),
                               credential=credential)
    span = telemetry.start_gateway_span(request.headers, model=str(body.get("model") or "")[:200],
                                        stream=body.get("stream") is True)
    with telemetry.current(span):
        exchange = services.exchange_prepare(owner=user, profile=profile, provider=provider, body=body,
                                             session_header=session_header, retry=_is_retry(request))
    exchange.span = span
    start = time.perf_counter()
    try:
        answer = upstream.post_chat(provider, api_key, exchange.body, stream=exchange.stream,
                                    trace_headers=telemetry.upstream_trace_headers(request.headers, span),
                                    nonfinite=_may_hold_nonfinite(request.body),
                                    credential=(credential.header, credential.value) if credential else None)
    except httpx2.TimeoutException as exc:
        return _unreachable(exchange, start, 504, f"the upstream provider did not answer within "
                                                  f"{provider.timeout:g} s ({type(exc).__name__})", "upstream_timeout")
    except httpx2.RequestError as exc:
        return _unreachable(exchange, start, 502, f"the upstream provider could not be reached: "
                                                  f"{type(exc).__name__}: {exc}", "upstream_unreachable")
    if exchange.stream and answer.status_code == 200:
        relay = _relay(answer, exchange, start)
        streaming = upstream.event_stream(answer, _for_server(request, relay), upstream.passed_headers(answer))
        _context_headers(streaming, exchange)
        _server_timing(streaming, parse=parse_ms, prepare=exchange.prepare_ms)
        return streaming
    try:
        content = answer.read()
    except httpx2.HTTPError as exc:
        return _unreachable(exchange, start, 502, f"the upstream answer broke off: {exc}", "upstream_unreachable")
    finally:
        answer.close()
    upstream_ms = (time.perf_counter() - start) * 1000
    recording = time.perf_counter()
    reply, usage = _completion_parts(content) if answer.status_code == 200 else (None, None)
    telemetry.note_completion(exchange.span, content)
    services.exchange_record(exchange, status_code=answer.status_code, reply=reply, usage=usage,
                             upstream_ms=upstream_ms)
    response = upstream.passthrough(answer, content)
    _context_headers(response, exchange)
    _server_timing(response, parse=parse_ms, prepare=exchange.prepare_ms, upstream=upstream_ms,
                   record=(time.perf_counter() - recording) * 1000)
    return response


def _server_timing(response: HttpResponseBase, **durations: float) -> None:
    # The gateway's own split of a call (milliseconds), for the benchmark and
    # for anyone looking at a slow call in the browser's or proxy's tools.
    response["Server-Timing"] = ", ".join(f"{name};dur={value:.2f}" for name, value in durations.items())


def _unreachable(exchange: Exchange, start: float, status: int, message: str, code: str) -> HttpResponse:
    services.exchange_record(exchange, status_code=status, upstream_ms=(time.perf_counter() - start) * 1000,
                             error=message)
    response = upstream.openai_error(status, message, type="server_error", code=code)
    _context_headers(response, exchange)
    return response


def _completion_parts(content: bytes) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """Choice 0's message and the usage of a completion, when the answer is one."""
    try:
        data = repaired(json.loads(content))
    except (ValueError, RecursionError):
        return None, None
    if not isinstance(data, dict):
        return None, None
    choices = data.get("choices")
    message = choices[0].get("message") if isinstance(choices, list) and choices and isinstance(
        choices[0], dict) else None
    usage = data.get("usage")
    return (message if isinstance(message, dict) else None), (usage if isinstance(usage, dict) else None)


def _relay(answer: httpx2.Response, exchange: Exchange, start: float) -> Iterator[bytes]:
    """The provider's events, passed on; the reply is recorded before ``[DONE]`` goes out.

    Recording first means a client that sends its next call the moment the
    stream ends finds its reply already in the session.
    """
    builder = sse.ReplyBuilder()
    recorded = False
    error = ""
    try:
        for event in sse.events(upstream.lines(answer.iter_bytes())):
            if event.done:
                _record_stream(exchange, builder, start, error)
                recorded = True
                yield event.encode()
                continue
            chunk = event.json()
            if isinstance(chunk, dict):
                builder.add(chunk)
                if exchange.strips_usage and chunk.get("usage"):
                    if sse.is_usage_only(chunk):
                        continue
                    event = sse.without_usage(event, chunk)
            yield event.encode()
    except GeneratorExit:
        error = "the client went away before the stream ended"
        raise
    except httpx2.HTTPError as exc:
        error = f"the upstream stream broke off: {type(exc).__name__}: {exc}"
    finally:
        answer.close()
        if not recorded:
            # Some providers end without [DONE]; a finished reply still counts.
            _record_stream(exchange, builder, start, error, keep_reply=not error)
    if not recorded and (error or not builder.complete):
        # Too late for a status code, and a stream that simply stops reads as a
        # finished (if short) reply: end it with an error event the SDKs raise
        # on, so the caller's own retry logic runs.
        yield sse.error_event(error or "the upstream stream ended before the reply was complete",
                              code="upstream_stream_broken").encode()


def _record_stream(exchange: Exchange, builder: sse.ReplyBuilder, start: float, error: str, *,
                   keep_reply: bool = True) -> None:
    reply = builder.message() if builder.complete and keep_reply else None
    if not builder.complete and not error:
        error = "the stream ended before the reply was complete"
    telemetry.note_answer(exchange.span, model=builder.model,
                          finish_reasons=[builder.finish_reason] if builder.finish_reason else [])
    services.exchange_record(exchange, status_code=200, reply=reply, usage=builder.usage,
                             upstream_ms=(time.perf_counter() - start) * 1000, error=error)


def _next(iterator: Iterator[bytes]) -> bytes | None:
    return next(iterator, None)


async def _pull(iterator: Iterator[bytes]) -> AsyncIterator[bytes]:
    # thread_sensitive: inside Django's per-request ThreadSensitiveContext this
    # is the request's own thread, so a slow provider holds that thread, not a
    # shared pool, and the generator always resumes where its DB connection is.
    step = sync_to_async(_next, thread_sensitive=True)
    try:
        while (chunk := await step(iterator)) is not None:
            yield chunk
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            await sync_to_async(close, thread_sensitive=True)()


def _for_server(request: HttpRequest, iterator: Iterator[bytes]) -> Iterator[bytes] | AsyncIterator[bytes]:
    return _pull(iterator) if isinstance(request, ASGIRequest) else iterator


# -- models ----------------------------------------------------------------------------------


def _passthrough_get(request: HttpRequest, path: str) -> HttpResponse:
    if request.method != "GET":
        return _method_not_allowed("GET")
    caller, refusal = _gateway_caller(request)
    if refusal is not None:
        return refusal
    assert caller is not None and caller.token is not None
    try:
        profile = services.profile_for(owner=caller.token.user,
                                       session_header=request.headers.get(SESSION_HEADER, "").strip(),
                                       profile_header=request.headers.get(PROFILE_HEADER, "").strip())
        provider, api_key = services.provider_for(profile)
    except GatewayError as exc:
        return _error(exc)
    credential, refusal = _openai_credential(caller, profile, provider)
    if refusal is not None:
        return refusal
    try:
        answer = upstream.get(provider, api_key, path,
                              credential=(credential.header, credential.value) if credential else None)
    except httpx2.TimeoutException:
        return upstream.openai_error(504, f"the upstream provider did not answer within {provider.timeout:g} s",
                                     type="server_error", code="upstream_timeout")
    except httpx2.TransportError as exc:
        return upstream.openai_error(502, f"the upstream provider could not be reached: {exc}",
                                     type="server_error", code="upstream_unreachable")
    return upstream.passthrough(answer, answer.content)


@csrf_exempt
def models(request: HttpRequest) -> HttpResponse:
    return _passthrough_get(request, "models")


@csrf_exempt
def model_detail(request: HttpRequest, model: str) -> HttpResponse:
    return _passthrough_get(request, f"models/{model}")


@csrf_exempt
def not_found(request: HttpRequest, rest: str) -> HttpResponse:
    return upstream.openai_error(404, f"ContextLab's gateway serves /v1/chat/completions, /v1/responses, "
                                      f"/v1/messages and /v1/models, not /v1/{rest}", code="unknown_url")


# -- Responses API ---------------------------------------------------------------------------


def _gateway_caller(request: HttpRequest) -> tuple[credentials.Credentials | None, HttpResponse | None]:
    """Who calls, or the answer that refuses them: the one place an OpenAI-shaped call is authenticated.

    The ContextLab token comes as the provider key (``Authorization: Bearer``),
    which is what an unmodified client sends, or in the dedicated header
    (``X-ContextLab-Token``, Codex's ``http_headers``) beside the client's own key."""
    caller = credentials.resolve(request.headers)
    if caller.token is None:
        return None, _unauthorized()
    retry_after = ratelimit.check("gateway", caller.token.key_hash)
    if retry_after is not None:
        return None, _rate_limited(retry_after)
    return caller, None


def _openai_credential(caller: credentials.Credentials, profile: AgentProfile, provider: UpstreamProvider,
                       ) -> tuple[credentials.ClientCredential | None, HttpResponse | None]:
    """The client's own provider credential when the provider forwards it (else None), or the refusal
    of a call that an OpenAI-shaped endpoint cannot serve with this provider."""
    if provider.kind == UpstreamProvider.Kind.ANTHROPIC:
        return None, upstream.openai_error(
            400, f"agent profile {profile.name!r} routes to an Anthropic Messages API provider ({provider.base_url}): "
                 "point this profile's upstream provider at an OpenAI-compatible API (kind: openai) in the admin, "
                 "or use /v1/messages", code="invalid_request")
    if not provider.forwards_client_credential:
        return None, None
    if caller.provider_credential is None:
        return None, upstream.openai_error(
            401, f"agent profile {profile.name!r} forwards your own provider credential, and the request "
                 f"carries none besides the ContextLab token: send the token in the {credentials.TOKEN_HEADER} "
                 "header and your provider key as Authorization: Bearer", code="invalid_api_key")
    return caller.provider_credential, None


def _websocket_refused() -> HttpResponse:
    # Codex first tries a WebSocket on GET /v1/responses; 426 tells it to use HTTP at once.
    return upstream.openai_error(426, "ContextLab's gateway speaks the Responses API over HTTP: "
                                          "POST /v1/responses (WebSocket is not supported)",
                                     code="websocket_not_supported")


@csrf_exempt
def responses(request: HttpRequest) -> HttpResponseBase:
    if request.method == "GET":
        return _websocket_refused()
    return _responses_call(request, observe.RESPONSES)


@csrf_exempt
def responses_compact(request: HttpRequest) -> HttpResponseBase:
    return _responses_call(request, observe.RESPONSES_COMPACT)


def _responses_call(request: HttpRequest, wire: observe.ResponsesWire) -> HttpResponseBase:
    if request.method != "POST":
        return _method_not_allowed("POST")
    caller, refusal = _gateway_caller(request)
    if refusal is not None:
        return refusal
    assert caller is not None and caller.token is not None
    user = caller.token.user
    try:
        body = _json_body(request)
        openai_responses.check(body)
        explicit = request.headers.get(SESSION_HEADER, "").strip()
        profile = services.profile_for(owner=user, session_header=explicit,
                                       profile_header=request.headers.get(PROFILE_HEADER, "").strip())
        provider, api_key = services.provider_for(profile)
    except openai_responses.BadRequest as exc:
        return upstream.openai_error(400, exc.message, code="invalid_request", param=exc.param)
    except GatewayError as exc:
        return _error(exc)
    credential, refusal = _openai_credential(caller, profile, provider)
    if refusal is not None:
        return refusal
    compaction = openai_responses.compaction_kind(body, request.headers, endpoint=wire.endpoint)
    kind = f"compaction.{compaction}" if compaction else openai_responses.request_kind(request.headers)
    # The agent's own name for its conversation when it gives one (Codex's thread), before any inference.
    conversation = openai_responses.conversation_key(request.headers, body)
    if observe.is_observed(provider):
        return observe.forward(request, owner=user, profile=profile, provider=provider, api_key=api_key, body=body,
                               session_header=explicit, client_conversation_id=conversation,
                               for_server=lambda it: _for_server(request, it),
                               wire=wire, kind=kind if kind != "turn" else "", credential=credential)
    return responses_managed.call(request, owner=user, profile=profile, provider=provider, api_key=api_key,
                                  body=body, session_header=explicit or conversation, wire=wire, kind=kind,
                                  credential=credential,
                                  retry=_is_retry(request), for_server=lambda it: _for_server(request, it))


# -- the Anthropic Messages API ----------------------------------------------------------------


def _anthropic_unauthorized() -> HttpResponse:
    return anthropic_messages.error_response(
        401, "ContextLab does not know this credential: send a ContextLab API token (manage.py createapitoken) "
             f"as x-api-key (ANTHROPIC_API_KEY), as Authorization: Bearer (ANTHROPIC_AUTH_TOKEN), or in the "
             f"{credentials.TOKEN_HEADER} header (ANTHROPIC_CUSTOM_HEADERS)")


def _anthropic_call(request: HttpRequest, wire: anthropic_messages.Wire) -> HttpResponseBase:
    """The checks every Messages API call passes, then observe mode's forwarding core or the manager."""
    if request.method != "POST":
        response = anthropic_messages.error_response(405, "use POST here")
        response["Allow"] = "POST"
        return response
    caller = credentials.resolve(request.headers)
    if caller.token is None:
        return _anthropic_unauthorized()
    retry_after = ratelimit.check("gateway", caller.token.key_hash)
    if retry_after is not None:
        response = anthropic_messages.error_response(
            429, f"Rate limit reached for this ContextLab token; try again in {retry_after} s.")
        response["Retry-After"] = str(retry_after)
        return response
    user = caller.token.user
    try:
        body = _json_body(request)
        problem = anthropic_messages.invalid(body)
        if problem:
            raise GatewayError(400, problem, code="invalid_request")
        contextlab_session = request.headers.get(SESSION_HEADER, "").strip()
        profile = services.profile_for(owner=user, session_header=contextlab_session,
                                       profile_header=request.headers.get(PROFILE_HEADER, "").strip())
        provider, api_key = services.provider_for(profile)
    except GatewayError as exc:
        return anthropic_messages.error_response(exc.status, exc.message)
    if provider.kind != UpstreamProvider.Kind.ANTHROPIC:
        return anthropic_messages.error_response(
            400, f"agent profile {profile.name!r} routes to an OpenAI-compatible provider ({provider.base_url}): "
                 "point this profile's upstream provider at an Anthropic Messages API (kind: anthropic) in the "
                 "admin, or use /v1/chat/completions")
    credential = None
    if provider.forwards_client_credential:
        credential = caller.provider_credential
        if credential is None:
            return anthropic_messages.error_response(
                401, f"agent profile {profile.name!r} forwards your own Anthropic credential, and the request "
                     f"carries none besides the ContextLab token: send the token in the {credentials.TOKEN_HEADER} "
                     "header and your Anthropic key as x-api-key (or Authorization: Bearer)")
    # Claude Code names its conversation; a ContextLab session header wins.
    session_header = contextlab_session or request.headers.get(anthropic_messages.SESSION_ID_HEADER, "").strip()
    if wire is anthropic_messages.COUNT_TOKENS:
        return _anthropic_count_tokens(request, provider, api_key, credential, owner=user, profile=profile,
                                       body=body, session_header=session_header)
    if observe.is_observed(provider):
        return observe.forward(request, owner=user, profile=profile, provider=provider, api_key=api_key,
                               body=body, session_header=session_header, wire=wire, credential=credential,
                               for_server=lambda it: _for_server(request, it))
    return managed_messages.call(request, owner=user, profile=profile, provider=provider, api_key=api_key,
                                 body=body, session_header=session_header, credential=credential,
                                 for_server=lambda it: _for_server(request, it), retry=_is_retry(request))


def _anthropic_count_tokens(request: HttpRequest, provider: UpstreamProvider, api_key: str,
                            credential: credentials.ClientCredential | None, *, owner: Any, profile: AgentProfile,
                            body: dict[str, Any], session_header: str) -> HttpResponseBase:
    """The provider's own count, passed back as it came (Claude's tokenizer is not public), and
    kept beside ContextLab's count of the same request for the session the agent names."""
    wire = anthropic_messages.COUNT_TOKENS
    start = time.perf_counter()
    try:
        answer = upstream.client().post(
            wire.url(provider, request), content=request.body,
            headers=wire.headers(provider, api_key, credential, request, stream=False),
            timeout=upstream._timeout(provider))
    except httpx2.TimeoutException:
        return anthropic_messages.error_response(504, f"the upstream provider did not answer within "
                                                      f"{provider.timeout:g} s")
    except httpx2.RequestError as exc:
        return anthropic_messages.error_response(502, f"the upstream provider could not be reached: "
                                                      f"{type(exc).__name__}: {exc}")
    counted = anthropic_messages.counted_tokens(answer.content) if answer.status_code == 200 else None
    try:
        services.count_record(
            owner=owner, profile=profile, session_header=session_header, endpoint=anthropic_messages.COUNT_ENDPOINT,
            status_code=answer.status_code, counted=counted, upstream_ms=(time.perf_counter() - start) * 1000,
            estimate=services.estimate_tokens(anthropic_messages.to_chat(body, thinking_text=False))
            if counted is not None else None)
    except Exception:
        # The agent's answer is decided: a count that could not be kept costs it nothing.
        log.exception("gateway: could not record a count_tokens answer")
    return upstream.passthrough(answer, answer.content, extra=wire.passed(answer),
                                not_json=anthropic_messages.error_response)


@csrf_exempt
def anthropic_messages_view(request: HttpRequest) -> HttpResponseBase:
    return _anthropic_call(request, anthropic_messages.MESSAGES)


@csrf_exempt
def anthropic_count_tokens_view(request: HttpRequest) -> HttpResponseBase:
    return _anthropic_call(request, anthropic_messages.COUNT_TOKENS)
