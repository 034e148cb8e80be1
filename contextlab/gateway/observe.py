"""Observe mode: the agent manages its own context; ContextLab forwards, records and explains.

The request goes upstream as the agent's bytes (no model mapping, no hook, no
usage stripping) and the provider's answer comes back as its bytes. Each
finished call is recorded (``ObservedCall``); then the inference runs over the
profile's recorded calls in order and the session of the call's conversation is
rebuilt from it, so the dashboard draws what the agent's own context manager
did. The provider call holds no transaction and no lock; the rebuild holds the
provider row's lock only for database work, so calls of one profile are
recorded and rebuilt one after the other.

A call that failed upstream is recorded for the record but left out of the
inference: the agent never saw a reply, and its retry is the call that counts.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, cast

import httpx2
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connections, transaction
from django.db.models import Count, Max, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseBase

from contextlab.engine.observe.inference import Observer, RecordedRequest
from contextlab.gateway import history, sse, upstream
from contextlab.gateway.credentials import ClientCredential
from contextlab.gateway.models import ObservedCall, UpstreamProvider
from contextlab.gateway.protocols import anthropic_messages, openai_responses
from contextlab.sessions.models import AgentProfile, AgentSession
from contextlab.sessions.services.observed import Parsed, observe, observed_session_write
from contextlab.support import telemetry

log = logging.getLogger(__name__)

TITLE_CHARS = 80


def is_observed(provider: UpstreamProvider) -> bool:
    return provider.mode == UpstreamProvider.Mode.OBSERVE


class Watcher(Protocol):
    """Reads a relayed stream's ``data:`` payloads on the side and adds up the reply."""

    def feed(self, payload: bytes) -> bool:
        """Take one payload; True when it ends the stream (the reply is then complete)."""
        ...

    def store(self, call: ObservedCall, error: str) -> None:
        """Write the reply (when complete and no ``error``) and the failure, if any, on the call."""
        ...

    @property
    def broken(self) -> bool:
        """The stream has not ended as the protocol ends a reply (so far)."""
        ...

    def note(self, span: Any) -> None:
        """Put the answer's model and finish reasons on the gateway's span (telemetry)."""


class Wire(Protocol):
    """What observe mode needs of a wire protocol: where and how to send, how to read the answer."""

    endpoint: str  # ObservedCall.endpoint: the protocol and which of its endpoints

    def url(self, provider: UpstreamProvider, request: HttpRequest) -> str: ...

    def headers(self, provider: UpstreamProvider, api_key: str, credential: ClientCredential | None,
                request: HttpRequest, *, stream: bool) -> dict[str, str]: ...

    def error(self, status: int, message: str, code: str) -> HttpResponse: ...

    def store_reply(self, call: ObservedCall, content: bytes) -> None: ...

    def watcher(self) -> Watcher: ...

    def broken_tail(self, message: str) -> bytes:
        """What ends a stream the upstream cut, so the client's SDK raises instead of taking a short reply."""
        ...

    def passed(self, answer: httpx2.Response) -> dict[str, str]: ...


class _ChatWatcher:
    def __init__(self) -> None:
        self.builder = sse.ReplyBuilder()

    def feed(self, payload: bytes) -> bool:
        if payload == b"[DONE]":
            return True
        with contextlib.suppress(ValueError):
            self.builder.add(json.loads(payload))
        return False

    def store(self, call: ObservedCall, error: str) -> None:
        call.error = error or ("" if self.builder.complete else "the stream ended early")
        if self.builder.complete and not call.error:
            _set_reply(call, self.builder.message())
            call.usage = self.builder.usage

    @property
    def broken(self) -> bool:
        return not self.builder.complete

    def note(self, span: Any) -> None:
        reasons = [self.builder.finish_reason] if self.builder.finish_reason else []
        telemetry.note_answer(span, model=self.builder.model, finish_reasons=reasons)


class _ChatWire:
    """OpenAI chat completions."""

    endpoint = "chat.completions"

    def url(self, provider: UpstreamProvider, request: HttpRequest) -> str:
        return provider.chat_url

    def headers(self, provider: UpstreamProvider, api_key: str, credential: ClientCredential | None,
                request: HttpRequest, *, stream: bool) -> dict[str, str]:
        return upstream.with_credential(upstream._headers(provider, api_key, stream=stream),
                                        (credential.header, credential.value) if credential is not None else None)

    def error(self, status: int, message: str, code: str) -> HttpResponse:
        return upstream.openai_error(status, message, type="server_error" if status >= 500 else
                                     "invalid_request_error", code=code)

    def store_reply(self, call: ObservedCall, content: bytes) -> None:
        _reply_from_completion(call, content)

    def watcher(self) -> Watcher:
        return _ChatWatcher()

    def broken_tail(self, message: str) -> bytes:
        # Observe mode passes a chat stream on as it came, cut or not (as it always has).
        return b""

    def passed(self, answer: httpx2.Response) -> dict[str, str]:
        return upstream.passed_headers(answer)


CHAT: Wire = _ChatWire()


def _post_raw(wire: Wire, provider: UpstreamProvider, api_key: str, credential: ClientCredential | None,
              request: HttpRequest, *, stream: bool, trace_headers: dict[str, str]) -> httpx2.Response:
    http = upstream.client()
    outgoing = http.build_request(
        "POST", wire.url(provider, request), content=request.body,
        headers={**wire.headers(provider, api_key, credential, request, stream=stream), **trace_headers},
        timeout=upstream._timeout(provider))
    return http.send(outgoing, stream=stream)


class _ResponsesWatcher:
    def __init__(self) -> None:
        self.reader = openai_responses.StreamReader()

    def feed(self, payload: bytes) -> bool:
        self.reader.feed(payload)
        return self.reader.finished

    def store(self, call: ObservedCall, error: str) -> None:
        if error or not self.reader.finished:
            call.error = error or "the stream ended early"
            return
        # A failed or incomplete response ends its stream as a whole one does: its answer says so.
        _set_answer(call, self.reader.answer)

    def note(self, span: Any) -> None:
        return  # the Responses reader keeps no model or finish reason yet

    @property
    def broken(self) -> bool:
        return not self.reader.finished


class ResponsesWire(_ChatWire):
    """The OpenAI Responses API (``/responses``, ``/responses/compact``): sent like chat completions,
    answered with a response object (or its events), whose id a later call's
    ``previous_response_id`` names."""

    def __init__(self, endpoint: str, path: str) -> None:
        self.endpoint = endpoint
        self.path = path  # under the provider's base URL

    def url(self, provider: UpstreamProvider, request: HttpRequest) -> str:
        return provider.url(self.path)

    def store_reply(self, call: ObservedCall, content: bytes) -> None:
        answer = openai_responses.answer_of(content)
        if answer is not None:
            _set_answer(call, answer)

    def watcher(self) -> Watcher:
        return _ResponsesWatcher()


def _set_answer(call: ObservedCall, answer: openai_responses.Answer) -> None:
    call.response_id = answer.response_id
    call.usage = answer.usage
    if answer.error:
        call.error = f"the provider ended the response unfinished: {answer.error}"
        return
    call.reply_text, call.reply_tool_calls = answer.reply()


RESPONSES = ResponsesWire(openai_responses.ENDPOINT, "responses")
RESPONSES_COMPACT = ResponsesWire(openai_responses.COMPACT_ENDPOINT, "responses/compact")


_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}")


def caller_trace_id(headers: Mapping[str, str]) -> str:
    """The trace id of the caller's W3C ``traceparent``; "" without one (or an invalid one)."""
    match = _TRACEPARENT.match(headers.get("traceparent", "").strip().lower())
    return match.group(1) if match and match.group(1) != "0" * 32 else ""


def forward(request: HttpRequest, *, owner: User, profile: AgentProfile, provider: UpstreamProvider, api_key: str,
            body: dict[str, Any], session_header: str,
            for_server: Callable[[Iterator[bytes]], Iterator[bytes] | AsyncIterator[bytes]],
            wire: Wire = CHAT, credential: ClientCredential | None = None, kind: str = "",
            client_conversation_id: str = "") -> HttpResponseBase:
    """Send the agent's bytes upstream and its answer back; record the call.

    ``for_server`` adapts the relayed stream to the server (WSGI or ASGI);
    ``wire`` is the protocol; ``credential`` the client's own provider
    credential, sent instead of ``api_key`` when the provider forwards it;
    ``kind`` what the agent said the call is for besides a turn
    ("compaction.local", "prewarm", ...). ``client_conversation_id`` is the
    conversation id the client sent in its own header (an adapter reads it:
    Claude Code's session id, Codex's): the inference never puts two ids in one
    conversation, nor splits one id's calls."""
    stream = body.get("stream") is True
    call = ObservedCall(owner=owner, profile=profile, body=body, session_header=session_header[:300],
                        endpoint=wire.endpoint, kind=kind[:32], client_id=client_conversation_id[:300],
                        trace_id=caller_trace_id(request.headers))
    span = telemetry.start_gateway_span(request.headers, model=str(body.get("model") or "")[:200], stream=stream)
    start = time.perf_counter()
    try:
        answer = _post_raw(wire, provider, api_key, credential, request, stream=stream,
                           trace_headers=telemetry.upstream_trace_headers(request.headers, span))
    except httpx2.TimeoutException as exc:
        return _failed(wire, call, span, start, 504, f"the upstream provider did not answer within "
                                               f"{provider.timeout:g} s ({type(exc).__name__})", "upstream_timeout")
    except httpx2.RequestError as exc:
        return _failed(wire, call, span, start, 502, f"the upstream provider could not be reached: "
                                               f"{type(exc).__name__}: {exc}", "upstream_unreachable")
    if stream and answer.status_code == 200:
        # Filled by the relay when it commits the call before the stream's last chunk, answering first.
        committed: list[ObservedCall] = []
        relay = _relay(wire, answer, call, start, span, provider, committed=committed if answer_first() else None)
        streaming = upstream.event_stream(answer, for_server(relay), wire.passed(answer))
        streaming["X-ContextLab-Managed"] = "false"
        _after_answer(streaming, committed, span)
        return streaming
    try:
        content = answer.read()
    except httpx2.HTTPError as exc:
        return _failed(wire, call, span, start, 502, f"the upstream answer broke off: {exc}", "upstream_unreachable")
    finally:
        answer.close()
    call.status_code = answer.status_code
    call.upstream_ms = (time.perf_counter() - start) * 1000
    if answer.status_code == 200:
        wire.store_reply(call, content)
        telemetry.note_completion(span, content)
    response = upstream.passthrough(answer, content, extra=wire.passed(answer),
                                    not_json=lambda status, message: wire.error(status, message, "upstream_not_json"))
    response["X-ContextLab-Managed"] = "false"
    if answer_first():
        # Committed before the answer leaves; the session is rebuilt once it has.
        if _pending_saved(call):
            response["X-ContextLab-Call"] = str(call.pk)
            _after_answer(response, [call], span)
        return response
    session = _recorded(call, provider, span)
    if call.pk is not None:
        response["X-ContextLab-Call"] = str(call.pk)
    if session is not None:
        response["X-ContextLab-Session"] = str(session.pk)
    return response


def answer_first() -> bool:
    """``CONTEXTLAB_OBSERVE_ANSWER_FIRST``: the answer goes out once the call is committed as a
    pending record, and the session is rebuilt after (see ``_after_answer``)."""
    return bool(settings.CONTEXTLAB_OBSERVE_ANSWER_FIRST)


# The calls this process committed as pending and has not yet rebuilt after their answer:
# what ``recording_drained`` waits for.
_in_flight: set[int] = set()
_in_flight_changed = threading.Condition()


def _pending_saved(call: ObservedCall) -> bool:
    """Commit the call alone, as a pending record (all a restart needs to finish it); False if it could not be."""
    try:
        call.save()
    except Exception:
        log.exception("observed call for profile %s could not be recorded", call.profile_id)
        return False
    with _in_flight_changed:
        _in_flight.add(call.pk)
    return True


def _after_answer(response: HttpResponseBase, committed: list[ObservedCall], span: Any) -> None:
    """Rebuild the session of the ``committed`` calls (committed as pending) once the answer has left.

    The server closes the response after sending its last byte, and Django
    runs the response's closers then, in the thread that ran the view (under
    ASGI, the thread of the request's own context): the rebuild never delays
    this call's answer. A stream's call is in ``committed`` only once the relay
    committed it, before the stream's last chunk. Were the process stopped
    before the rebuild, the call stays pending, and the next call of the
    profile, ``settle_pending`` at start or the beat's ``settle_observed_calls``
    take it in, in the order the calls were recorded."""
    def rebuild() -> None:
        for call in committed:
            _rebuild_after_answer(call, span)

    # Django's own list of what ``close()`` calls (it closes the streamed iterator through it too).
    cast(Any, response)._resource_closers.append(rebuild)


# Per profile: the answered calls waiting for their rebuild in this process, and the
# profiles a thread is rebuilding. Answering first takes away the agent's wait for
# the rebuild, and with it what held an agent back: without this, calls answered
# faster than their profile's rebuilds (which run one at a time, under the
# provider's lock) would pile up threads and database connections waiting for it.
_waiting: dict[int, list[tuple[ObservedCall, Any]]] = {}
_rebuilding: set[int] = set()


def _rebuild_after_answer(call: ObservedCall, span: Any) -> None:
    """Take ``call`` into its session, with every call of its profile answered meanwhile.

    One thread per profile rebuilds; a call answered while it does joins the
    next round of that thread (one rebuild takes in every pending call, in
    order), and its own thread is free at once."""
    profile_id = call.profile_id
    with _in_flight_changed:
        _waiting.setdefault(profile_id, []).append((call, span))
        if profile_id in _rebuilding:
            return
        _rebuilding.add(profile_id)
    while True:
        with _in_flight_changed:
            batch = _waiting.pop(profile_id, [])
            if not batch:
                _rebuilding.discard(profile_id)
                return
        try:
            _rebuilt(batch)
        except Exception:  # Django swallows a closer's exception: say it here
            log.exception("observed calls of profile %s: the session could not be rebuilt after the answer",
                          profile_id)
        finally:
            for answered, _ in batch:
                _landed(answered)


def _landed(call: ObservedCall) -> None:
    with _in_flight_changed:
        _in_flight.discard(call.pk)
        _in_flight_changed.notify_all()


def recording_drained(timeout: float = 30.0) -> bool:
    """Wait until every call this process answered first has been rebuilt; False on timeout.

    For tests and for a graceful stop: the client has its answer before the
    session holds the turn."""
    with _in_flight_changed:
        return _in_flight_changed.wait_for(lambda: not _in_flight, timeout=timeout)


def _recorded(call: ObservedCall, provider: UpstreamProvider, span: Any) -> AgentSession | None:
    """``record``, and the call's span ended with what it found (when telemetry is on)."""
    return _span_ended(call, span, record(call, provider))


def _rebuilt(batch: list[tuple[ObservedCall, Any]]) -> None:
    """The second half of ``record`` for calls (of one profile) already committed as pending; their spans ended."""
    inferred = [call for call, _ in batch if _inferred(call)]
    sessions: dict[int, AgentSession] = {}
    if inferred:
        try:
            sessions = _settle(inferred[0].owner_id, inferred[0].profile, inferred)
        except Exception:
            log.exception("observed calls of profile %s: the session could not be rebuilt", inferred[0].profile_id)
    for call, span in batch:
        _span_ended(call, span, sessions.get(call.pk))


def _span_ended(call: ObservedCall, span: Any, session: AgentSession | None) -> AgentSession | None:
    if span is not None:
        reply: dict[str, Any] = {"role": "assistant", "content": call.reply_text or None}
        if call.reply_tool_calls:
            reply["tool_calls"] = call.reply_tool_calls
        telemetry.finish_gateway_span(span, status_code=call.status_code, usage=call.usage,
                                      session_id=session.pk if session is not None else None, error=call.error,
                                      request=call.body if isinstance(call.body, dict) else None,
                                      reply=reply if call.status_code == 200 and not call.error else None)
    return session


def _failed(wire: Wire, call: ObservedCall, span: Any, start: float, status: int, message: str,
            code: str) -> HttpResponse:
    call.status_code = status
    call.error = message
    call.upstream_ms = (time.perf_counter() - start) * 1000
    call.save()
    telemetry.finish_gateway_span(span, status_code=status, usage=None, error=message)
    response = wire.error(status, message, code)
    response["X-ContextLab-Managed"] = "false"
    return response


def _reply_from_completion(call: ObservedCall, content: bytes) -> None:
    try:
        data = json.loads(content)
    except ValueError:
        return
    choices = data.get("choices") if isinstance(data, dict) else None
    message = choices[0].get("message") if isinstance(choices, list) and choices and isinstance(
        choices[0], dict) else None
    if isinstance(message, dict):
        _set_reply(call, message)
    usage = data.get("usage") if isinstance(data, dict) else None
    call.usage = usage if isinstance(usage, dict) else None


def _set_reply(call: ObservedCall, message: dict[str, Any]) -> None:
    content = message.get("content")
    call.reply_text = content if isinstance(content, str) else ""
    calls = message.get("tool_calls")
    call.reply_tool_calls = calls if isinstance(calls, list) else []


def _relay(wire: Wire, answer: httpx2.Response, call: ObservedCall, start: float, span: Any,
           provider: UpstreamProvider, *, committed: list[ObservedCall] | None = None) -> Iterator[bytes]:
    """The provider's bytes, unchanged; the reply is parsed on the side and recorded before the
    chunk that ends the stream goes out, so the agent's next call finds it.

    With ``committed`` (answering first), the call is only committed as pending
    there and added to it; the session is rebuilt when the response closes."""
    watcher = wire.watcher()
    pending = b""
    recorded = False
    error = ""
    try:
        for chunk in answer.iter_bytes():
            pending += chunk
            *complete, pending = pending.split(b"\n")
            done = False
            for line in complete:
                line = line.rstrip(b"\r")
                if line.startswith(b"data:") and watcher.feed(line[5:].strip()):
                    done = True
            if done and not recorded:
                _finish(call, watcher, start, "", span)
                if committed is None:
                    _recorded(call, provider, span)
                elif _pending_saved(call):
                    committed.append(call)
                recorded = True
            yield chunk
    except httpx2.HTTPError as exc:
        error = f"the upstream stream broke off: {type(exc).__name__}: {exc}"
    finally:
        answer.close()
        if not recorded:
            _finish(call, watcher, start, error, span)
            _recorded(call, provider, span)
    if not recorded and (error or watcher.broken):
        tail = wire.broken_tail(call.error or "the upstream stream ended before the reply was complete")
        if tail:
            yield tail



def _finish(call: ObservedCall, watcher: Watcher, start: float, error: str, span: Any = None) -> None:
    watcher.note(span)
    call.status_code = 200
    call.upstream_ms = (time.perf_counter() - start) * 1000
    watcher.store(call, error)


def _recorded_request(seq: int, call: ObservedCall, earlier: list[RecordedRequest] | None = None) -> RecordedRequest:
    """The call as the inference reads it: a chat-completions request and its reply.

    Each protocol's adapter converts its body. ``earlier``: the requests recorded
    before it, where the chain a Responses call continues (``previous_response_id``)
    is found."""
    body = call.body if isinstance(call.body, dict) else {}
    session_header = call.session_header
    if call.endpoint == anthropic_messages.ENDPOINT:
        conversation = (call.owner_id, call.profile_id, call.session_header) if call.session_header else None
        body = anthropic_messages.with_applied_edits(anthropic_messages.to_chat(body, conversation=conversation),
                                                     call.provider_edits)
    elif call.endpoint in (RESPONSES.endpoint, RESPONSES_COMPACT.endpoint):
        body = _responses_view(call, body, earlier or [])
    # The agent's compaction request is a side call, under no id: the inference
    # attaches it to the conversation it quotes.
    named = not call.kind.startswith("compaction")
    return RecordedRequest(seq=seq, body=body, reply_text=call.reply_text,
                           session_header=session_header if named else "",
                           reply_tool_calls=list(call.reply_tool_calls or []), usage=call.usage,
                           client_conversation_id=call.client_id if named else "", trace_id=call.trace_id,
                           resource=call.resource)


# Where the chat view of a Responses call keeps what the inference does not read.
VIEW_KEY = "contextlab"


def _responses_view(call: ObservedCall, body: dict[str, Any], earlier: list[RecordedRequest]) -> dict[str, Any]:
    """A Responses call as a chat-completions body.

    A compaction request is the agent's context manager asking for a summary. A
    call continuing ``previous_response_id`` carries only its new items; the
    conversation before it is the chain the gateway saw go by."""
    meta: dict[str, Any] = {"protocol": "openai.responses", "response_id": call.response_id, "kind": call.kind,
                            "opening": openai_responses.opening_request(openai_responses.items_of(body))[:400]}
    if call.kind.startswith("compaction"):
        view = openai_responses.compaction_side_call(body, remote=call.kind == "compaction.remote")
        view[VIEW_KEY] = meta
        return view
    previous = body.get("previous_response_id")
    chain: list[dict[str, Any]] | None = None
    if isinstance(previous, str) and previous:
        found = next((r for r in reversed(earlier) if isinstance(r.body.get(VIEW_KEY), dict)
                      and r.body[VIEW_KEY].get("response_id") == previous), None)
        if found is None:
            meta["chain"] = "outside"
            meta["previous_response_id"] = previous[:200]
        else:
            meta["chain"] = "resolved"
            reply: dict[str, Any] = {"role": "assistant", "content": found.reply_text or None}
            if found.reply_tool_calls:
                reply["tool_calls"] = found.reply_tool_calls
            chain = [*found.messages, reply]
    view = openai_responses.to_chat(body, earlier=chain)
    view[VIEW_KEY] = meta
    return view


def chain_warnings(requests: list[RecordedRequest], seqs: list[int]) -> list[str]:
    """What a session of Responses calls must say about the conversation it could not see."""
    warnings = []
    for seq in seqs:
        meta = requests[seq - 1].body.get(VIEW_KEY)
        if isinstance(meta, dict) and meta.get("chain") == "outside":
            warnings.append(f"request {seq} continues response {meta.get('previous_response_id')}, which did not "
                            "pass through ContextLab: the provider holds the conversation before it, and this "
                            "session starts there")
    return warnings


def record(call: ObservedCall, provider: UpstreamProvider) -> AgentSession | None:
    """Store the call and rebuild the session of its conversation; None when it is not part of one.

    The call is committed on its own first, as a pending record: whatever stops
    the process after that (kill -9 included), the next rebuild of the profile,
    or ``settle_pending`` at start, takes it into its session. The agent's answer
    never depends on this: a rebuild that fails is logged and the call stays
    pending, so the next call's rebuild includes it.
    """
    try:
        call.save()
    except Exception:
        log.exception("observed call for profile %s could not be recorded", call.profile_id)
        return None
    return _settled(call)


def _settled(call: ObservedCall) -> AgentSession | None:
    """Take the committed ``call`` (and every call pending before it) into its session."""
    if not _inferred(call):
        return None
    try:
        return _settle(call.owner_id, call.profile, [call]).get(call.pk)
    except Exception:
        log.exception("observed call for profile %s: the session could not be rebuilt", call.profile_id)
        return None


def _pending(owner_id: int, profile_id: int) -> QuerySet[ObservedCall]:
    """The profile's calls the inference reads and no rebuild has taken in yet.

    A rebuild gives every call it reads a conversation (the inference puts each
    request in one, as a turn or a side call), so an empty one means pending."""
    return ObservedCall.objects.filter(owner_id=owner_id, profile_id=profile_id, status_code=200, error="",
                                       conversation="").exclude(kind="prewarm")


def _settle(owner_id: int, profile: AgentProfile, known: list[ObservedCall] | None = None) -> dict[int, AgentSession]:
    """Rebuild with every pending call of the profile, in the order they were recorded.

    ``known``: calls this process holds, not read back (their bodies are the largest thing read)."""
    held = {call.pk: call for call in known or []}
    with transaction.atomic():
        # One profile's calls are taken in the order they finished.
        UpstreamProvider.objects.select_for_update().filter(profile_id=profile.pk).first()
        pks = list(_pending(owner_id, profile.pk).order_by("pk").values_list("pk", flat=True))
        if not pks:
            return {}  # another call's rebuild took them in
        read = {c.pk: c for c in ObservedCall.objects.filter(pk__in=[pk for pk in pks if pk not in held])}
        return _rebuild(owner_id, profile, [held.get(pk) or read[pk] for pk in pks])


def settle_pending() -> int:
    """Take into their sessions the calls a stopped process recorded but did not rebuild; how many.

    Run at start (and by the beat): a call that nobody follows up would
    otherwise wait for the next call of its profile."""
    settled = 0
    owners = (ObservedCall.objects.filter(status_code=200, error="", conversation="").exclude(kind="prewarm")
              .values_list("owner_id", "profile_id").distinct())
    for owner_id, profile_id in list(owners):
        profile = AgentProfile.objects.filter(pk=profile_id).first()
        if profile is None:
            continue
        try:
            settled += len(_settle(owner_id, profile))
        except Exception:
            log.exception("observed calls of profile %s: the pending calls could not be rebuilt", profile_id)
    return settled


def settle_at_start() -> None:
    """``settle_pending`` when a server starts (``CONTEXTLAB_SETTLE_AT_START``); never stops the start."""
    if not settings.CONTEXTLAB_SETTLE_AT_START:
        return
    try:
        settled = settle_pending()
    except Exception:  # e.g. a database not migrated yet: the beat and the next call settle later
        log.exception("observed calls left pending could not be settled at start")
        return
    finally:
        connections.close_all()  # this thread serves no request: its connection is not kept
    if settled:
        log.info("observed calls left pending by a stopped process: %d taken into their sessions", settled)


def _inferred(call: ObservedCall) -> bool:
    """Whether the inference reads the call: answered, and not a cache warm-up the agent never read."""
    return call.status_code == 200 and not call.error and call.kind != "prewarm"


@dataclass
class _Observed:
    """The inference over one profile's recorded calls, kept in the process and fed one call at a time."""

    observer: Observer
    requests: list[RecordedRequest]
    call_ids: list[int]
    parsed: Parsed
    # When the newest call was recorded: with the count and the last id, what tells
    # this inference from one over another database's calls (a restored backup).
    newest: datetime | None = None
    # Each conversation's session, found once (finding it reads the JSON of the owner's sessions).
    sessions: dict[str, AgentSession] = field(default_factory=dict)

    def session_for(self, call: ObservedCall, conversation_id: str, first: RecordedRequest) -> AgentSession:
        known = self.sessions.get(conversation_id)
        if known is not None and AgentSession.objects.filter(pk=known.pk).exists():
            return known
        return _session_for(call, conversation_id, first)

    def fingerprint(self) -> tuple[int, int | None, datetime | None]:
        return len(self.call_ids), (self.call_ids[-1] if self.call_ids else None), self.newest


# Profiles whose inference this process keeps (least recently recorded go first).
# Each holds its recorded requests: memory grows with the agent runs they observe.
KEPT_PROFILES = 8
_kept: OrderedDict[int, _Observed] = OrderedDict()
_kept_lock = threading.Lock()


def _take(profile_id: int) -> _Observed | None:
    # Taken out while a call uses it: a transaction that fails never puts back half an update.
    with _kept_lock:
        return _kept.pop(profile_id, None)


def _keep(profile_id: int, observed: _Observed) -> None:
    with _kept_lock:
        _kept[profile_id] = observed
        while len(_kept) > KEPT_PROFILES:
            _kept.popitem(last=False)


def _observed_before(recorded: QuerySet[ObservedCall], new: list[ObservedCall], profile_id: int) -> _Observed:
    """The inference over the profile's calls before ``new``: the one this process kept when the
    database still holds exactly the calls it saw (one query), else read again from every call."""
    earlier = recorded.exclude(pk__in=[c.pk for c in new])
    kept = _take(profile_id)
    if kept is not None:
        seen = earlier.aggregate(count=Count("pk"), last=Max("pk"), newest=Max("created"))
        if (seen["count"], seen["last"], seen["newest"]) == kept.fingerprint():
            return kept
        # Another process recorded calls of this profile since: read them all.
    calls = list(earlier.order_by("pk"))
    requests: list[RecordedRequest] = []
    for seq, c in enumerate(calls, start=1):
        requests.append(_recorded_request(seq, c, requests))
    return _Observed(observer=observe(requests), requests=requests, call_ids=[c.pk for c in calls], parsed=Parsed(),
                     newest=max((c.created for c in calls), default=None))


def _rebuild(owner_id: int, profile: AgentProfile, new: list[ObservedCall]) -> dict[int, AgentSession]:
    """Run the inference over every recorded call of the profile and rewrite the sessions of the
    conversations the ``new`` calls belong to; the session of each new call, by its id.

    The inference reads the calls in order and never revises what it found, so the
    process keeps it between calls and feeds it only the new ones; the sessions'
    rows are rewritten from it (reusing what earlier rewrites parsed).
    """
    recorded = ObservedCall.objects.filter(owner_id=owner_id, profile_id=profile.pk, status_code=200,
                                           error="").exclude(kind="prewarm")
    observed = _observed_before(recorded, new, profile.pk)
    for call in sorted(new, key=lambda c: c.pk):
        if not _inferred(call):
            continue
        request = _recorded_request(len(observed.requests) + 1, call, observed.requests)
        observed.requests.append(request)
        observed.call_ids.append(call.pk)
        observed.newest = max(observed.newest, call.created) if observed.newest else call.created
        observed.observer.observe(request)
    observer, requests = observed.observer, observed.requests
    seq_of = {pk: seq for seq, pk in enumerate(observed.call_ids, start=1)}
    sessions: dict[int, AgentSession] = {}
    written: set[str] = set()
    for call in new:
        seq = seq_of.get(call.pk)
        conversation = next(
            (c for c in observer.conversations.values()
             if seq in c.requests or any(s.seq == seq for s in c.side_calls)), None) if seq else None
        if conversation is None:
            continue
        call.conversation = conversation.id
        call.side_call = seq not in conversation.requests
        session = observed.session_for(call, conversation.id, requests[conversation.requests[0] - 1])
        call.session = session
        call.save(update_fields=["conversation", "side_call", "session"])
        if conversation.id not in written:
            written.add(conversation.id)
            session = observed_session_write(session, requests, conversation.id, observer, parsed=observed.parsed)
            _warn(session, chain_warnings(requests, conversation.requests))
            observed.sessions[conversation.id] = session
        sessions[call.pk] = session
    # Kept for the next call once this one is committed; a rollback drops it.
    transaction.on_commit(lambda: _keep(profile.pk, observed))
    return sessions


def _warn(session: AgentSession, warnings: list[str]) -> None:
    """Add the protocol's warnings to the session's source, once each."""
    source = session.source if isinstance(session.source, dict) else {}
    known = list(source.get("warnings") or [])
    fresh = [w for w in warnings if w not in known]
    if fresh:
        session.source = {**source, "warnings": [*known, *fresh][:100]}
        AgentSession.objects.filter(pk=session.pk).update(source=session.source)


def record_spans(*, owner: User, profile: AgentProfile, records: list[dict[str, Any]]) -> list[AgentSession]:
    """LLM calls received as OpenTelemetry spans (``contextlab.engine.observe.otlp`` records), recorded like
    the calls observe mode forwards, and the sessions of their conversations rebuilt."""
    if not records:
        return []
    with transaction.atomic():
        # One profile's calls are taken in the order they arrived.
        AgentProfile.objects.select_for_update().filter(pk=profile.pk).first()
        fresh = _not_recorded_yet(owner, profile, records)
        if not fresh:
            return []
        calls = [ObservedCall.objects.create(
            owner=owner, profile=profile, body=record["body"], reply_text=str(record.get("response_text") or ""),
            reply_tool_calls=list(record.get("response_tool_calls") or []),
            usage=record["usage"] if isinstance(record.get("usage"), dict) else None,
            session_header=str(record.get("session_id") or "")[:300], status_code=200, span=span,
            trace_id=str(record.get("trace_id") or "")[:32], resource=str(record.get("resource") or "")[:64])
            for record, span in fresh]
        sessions = _rebuild(owner.pk, profile, calls)
    unique: dict[Any, AgentSession] = {s.pk: s for s in sessions.values()}
    return list(unique.values())


# Spans looked up per query: below SQLite's smallest limit on a statement's parameters.
SPAN_LOOKUP_BATCH = 500


def span_ref(record: dict[str, Any]) -> str:
    """The record's span as "<trace id>/<span id>"; "" when the exporter sent no ids (never deduplicated)."""
    trace_id, span_id = str(record.get("trace_id") or ""), str(record.get("span_id") or "")
    if not span_id:
        return ""
    ref = f"{trace_id}/{span_id}"
    # Real ids take 49 characters; longer ones (not OTLP's) are kept apart by a digest, never cut.
    return ref if len(ref) <= 100 else "sha256:" + hashlib.sha256(ref.encode("utf-8", "replace")).hexdigest()


def _not_recorded_yet(owner: User, profile: AgentProfile,
                      records: list[dict[str, Any]]) -> list[tuple[dict[str, Any], str]]:
    """The records (with their span refs) whose span this profile has not recorded.

    OTLP exporters send a batch again when its answer did not come back in time
    (the spec's retry on timeouts, 429 and 5xx), though the first attempt may
    have been recorded: the same span must not become a second call.
    """
    refs = [span_ref(record) for record in records]
    wanted = sorted({ref for ref in refs if ref})
    seen: set[str] = set()
    for start in range(0, len(wanted), SPAN_LOOKUP_BATCH):
        seen.update(ObservedCall.objects.filter(owner=owner, profile=profile,
                                                span__in=wanted[start:start + SPAN_LOOKUP_BATCH])
                    .values_list("span", flat=True))
    fresh: list[tuple[dict[str, Any], str]] = []
    for record, ref in zip(records, refs, strict=True):
        if ref:
            if ref in seen:
                continue
            seen.add(ref)  # the same span twice in one batch
        fresh.append((record, ref))
    return fresh


def _session_for(call: ObservedCall, conversation_id: str, first: RecordedRequest) -> AgentSession:
    found = (AgentSession.objects.filter(owner_id=call.owner_id, profile_id=call.profile_id,
                                         source__format="observed", source__conversation=conversation_id)
             .order_by("created").first())
    if found is not None:
        return found
    opening = next((m for m in first.messages if m.get("role") == "user"), {})
    content = opening.get("content")
    text = history.without_reminders(content if isinstance(content, str) else " ".join(
        str(p.get("text", "")) for p in content or [] if isinstance(p, dict)))
    meta = first.body.get(VIEW_KEY)
    if isinstance(meta, dict) and meta.get("opening"):
        # Another protocol's adapter knows the user's first words better (past an agent's harness context).
        text = str(meta["opening"])
    profile = call.profile
    return AgentSession.objects.create(
        owner_id=call.owner_id, profile=profile, title=" ".join(text.split())[:TITLE_CHARS] or "Observed agent",
        source={"format": "observed", "conversation": conversation_id, "warnings": []},
        tokens_window=profile.max_input_length, tokens_threshold=profile.threshold)
