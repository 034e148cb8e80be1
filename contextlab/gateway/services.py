"""The gateway's workflow: who is calling, which session, what goes upstream, what is recorded.

A call has two database steps around the provider call, and the provider call
itself holds no transaction and no lock:

1. ``exchange_prepare``: find the session the client's history belongs to (or
   a new one, not saved yet), and run the hook on the messages it has not
   seen, under the session's lock, **without writing**: the upstream request
   is built from the engine's payload. Any failure here leaves the request as
   the client sent it (``managed=False``) and is written down; the agent never
   notices.
2. ``exchange_record``: only once the provider answered, write the turn, the
   new messages and the provider's reply (so the next call's tool results
   pair with its tool calls), store the provider's usage beside our count of
   the turn, and write the ``GatewayExchange`` row. A call the provider
   refused (429, 5xx), that timed out or broke off leaves the session as it
   was, so a client's retries add nothing but their own exchange rows.

The one exception is a hook that compacted: its summary is written at once
(see ``sessions.session_advance_pending``).
"""

from __future__ import annotations

import json
import logging
import shutil
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import F
from django.utils.timezone import now

from contextlab.api.decorators import LAST_USED_RESOLUTION
from contextlab.api.models import ApiToken, hash_token
from contextlab.engine.convert import from_openai
from contextlab.engine.core.errors import ContextLabError, InvalidMessages, InvalidProfile
from contextlab.engine.core.schemas import check_tools, schema_tokens
from contextlab.engine.core.tokens import REPLY_PRIMING_TOKENS, TiktokenCounter
from contextlab.engine.hook import AgentCompaction
from contextlab.gateway import history, lookups
from contextlab.gateway.models import (
    GatewayExchange,
    GatewaySession,
    ObservedCall,
    UpstreamMisconfigured,
    UpstreamProvider,
)
from contextlab.sessions import services as sessions
from contextlab.sessions.models import AgentProfile, AgentSession, Turn
from contextlab.support import telemetry

log = logging.getLogger(__name__)

SESSION_HEADER = "X-ContextLab-Session"
PROFILE_HEADER = "X-ContextLab-Profile"
MAX_KEY_LENGTH = 300
# Sessions compared per call under one key: enough for parallel runs of one
# task, bounded so a key reused thousands of times does not slow every call.
MAX_CANDIDATES = 20
TITLE_CHARS = 80
# Conversations whose last request this process keeps, to digest only their new
# messages: each holds references to one request's messages (bounded memory).
known_digests = history.PrefixDigests(size=64)


class GatewayError(Exception):
    """A request the gateway answers itself, in OpenAI's error shape."""

    def __init__(self, status: int, message: str, *, code: str, type: str = "invalid_request_error",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.type = type
        self.param = param


# -- who and where -------------------------------------------------------------------------


def token_user(authorization: str) -> User | None:
    """The active user owning the bearer token, or None."""
    token = token_for(authorization)
    return token.user if token is not None else None


def token_for(authorization: str) -> ApiToken | None:
    """The bearer token, when it is valid and its user active; None otherwise."""
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    key_hash = hash_token(value.strip())
    token = lookups.kept(("token", key_hash),
                         lambda: ApiToken.objects.select_related("user").filter(key_hash=key_hash).first())
    if token is None or not token.user.is_active:
        return None
    moment = now()
    if token.last_used is None or moment - token.last_used > LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used=moment)
        # The kept copy would otherwise ask for this write again on every call.
        token.last_used = moment
        lookups.keep(("token", key_hash), token)
    return token


def _as_uuid(value: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


def profile_for(*, owner: User, session_header: str = "", profile_header: str = "") -> AgentProfile:
    """The profile a call runs under.

    A session id in the session header means that session's profile; else the
    profile header; else the caller's only profile with an upstream provider
    (or the one named "default" among several), so an unmodified client,
    which can send no header, works for the common one-agent set-up.
    """
    session_id = _as_uuid(session_header) if session_header else None
    if session_id is not None:
        session = (AgentSession.objects.select_related("profile").defer("engine_state")
                   .filter(pk=session_id, owner=owner).first())
        if session is not None:
            return session.profile
    if profile_header:
        try:
            return lookups.kept(("profile", owner.pk, profile_header),
                                lambda: sessions.profile_resolve(owner=owner, ref=profile_header))
        except InvalidProfile as exc:
            raise GatewayError(400, f"you have no agent profile {profile_header!r}",
                               code="contextlab_unknown_profile", param=PROFILE_HEADER) from exc
    routed = lookups.kept(("routed", owner.pk), lambda: list(
        AgentProfile.objects.filter(owner=owner, upstream__isnull=False).order_by("name")))
    if len(routed) == 1:
        return routed[0]
    if not routed:
        raise GatewayError(400, "none of your agent profiles has an upstream provider: add one in the admin "
                                "(Gateway › Upstream providers) with the provider's base URL and key",
                           code="contextlab_no_upstream")
    for profile in routed:
        if profile.name == "default":
            return profile
    names = ", ".join(repr(p.name) for p in routed)
    raise GatewayError(400, f"several of your agent profiles have an upstream provider ({names}); name one "
                            f"in the {PROFILE_HEADER} header", code="contextlab_ambiguous_profile",
                       param=PROFILE_HEADER)


def provider_for(profile: AgentProfile) -> tuple[UpstreamProvider, str]:
    """The profile's upstream provider and the key to send to it."""
    provider = lookups.kept(("provider", profile.pk), lambda: UpstreamProvider.objects.filter(profile=profile).first())
    if provider is None:
        raise GatewayError(400, f"agent profile {profile.name!r} has no upstream provider: add one in the admin "
                                "(Gateway › Upstream providers) with the provider's base URL and key",
                           code="contextlab_no_upstream")
    provider.profile = profile
    try:
        return provider, provider.resolve_api_key()
    except UpstreamMisconfigured as exc:
        raise GatewayError(500, str(exc), code="contextlab_upstream_misconfigured", type="server_error") from exc


# -- one call --------------------------------------------------------------------------------


@dataclass
class Exchange:
    """One call on its way through: what goes upstream, and what to record afterwards."""

    owner: User
    profile: AgentProfile
    provider: UpstreamProvider
    body: dict[str, Any]
    stream: bool = False
    client_wants_usage: bool = False
    managed: bool = False
    session: AgentSession | None = None
    turn: int | None = None
    identity: str = ""
    client_messages: int = 0
    matched: int = 0
    new: int = 0
    upstream_messages: int = 0
    error_stage: str = ""
    error: str = ""
    prepare_ms: float = 0.0
    model: str = ""
    notes: list[str] = field(default_factory=list)
    # What ``exchange_record`` writes once the provider answered.
    pending: sessions.PendingTurn | None = None
    key: str = ""
    kind: str = ""
    forked_from: AgentSession | None = None
    digests: list[str] = field(default_factory=list)
    # The chained digest after each message of the request (``history.chained``).
    chains: list[str] = field(default_factory=list)
    rest: list[Any] = field(default_factory=list)
    # The session's ingested history when the call was prepared (a repeat's ends with the reply it replaces).
    history_length: int = 0
    prepared: datetime = field(default_factory=now)
    retry: bool = False
    # The call's span when telemetry is on (``contextlab.support.telemetry``); ended by ``exchange_record``.
    span: Any = None
    # The session's gateway row as the call was prepared (None for a new session).
    gateway: GatewaySession | None = None
    # The wire protocol the client spoke (``GatewayExchange.endpoint``).
    endpoint: str = "chat.completions"
    # The provider's id for its answer, when it gives one (``GatewayExchange.response_id``).
    response_id: str = ""
    # Steps of the turn's decision flow the protocol adds (``unknown_content_step``): written into
    # the turn's trace once the turn is.
    steps: list[dict[str, Any]] = field(default_factory=list)

    @property
    def strips_usage(self) -> bool:
        """The gateway asked for the usage chunk on the client's behalf and must take it out again."""
        return self.managed and self.stream and not self.client_wants_usage


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ContextLabError):
        where = f" ({exc.field})" if exc.field else ""
        return f"{type(exc).__name__}: {exc.message}{where}"
    return f"{type(exc).__name__}: {exc}"


def exchange_prepare(*, owner: User, profile: AgentProfile, provider: UpstreamProvider, body: dict[str, Any],
                     session_header: str = "", retry: bool = False, endpoint: str = "chat.completions",
                     agent_compaction: AgentCompaction | None = None,
                     chained_to: AgentSession | None = None) -> Exchange:
    """Manage the call's context; on any ContextLab failure, forward it as it came.

    ``retry``: the client says this is a retry of a call it made before (the
    OpenAI SDKs send ``X-Stainless-Retry-Count``). Only a retry may replace the
    reply recorded for the same request; the same request without it is a
    second run of the same task, which gets its own session.

    ``agent_compaction``: the request is the agent's first after compacting its
    own context (its protocol adapter recognised it). When its history no
    longer continues the session's, the call continues that same session
    anyway: what the agent sent replaces the managed context, as a compaction
    turn of the agent's (identity "compacted"), instead of forking a new one.

    ``chained_to``: the request carries only what follows that session's
    history (the provider holds the rest: ``previous_response_id``); its
    messages join that session as they are (identity "chained")."""
    start = time.perf_counter()
    stream = body.get("stream") is True
    options = body.get("stream_options")
    exchange = Exchange(owner=owner, profile=profile, provider=provider, body=_unmanaged(provider, body),
                        stream=stream, model=str(body.get("model") or "")[:200],
                        client_wants_usage=stream and isinstance(options, dict) and options.get("include_usage") is True,
                        retry=retry, endpoint=endpoint)
    stage = "identity"
    try:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise InvalidMessages("messages must be a non-empty list of chat messages", field="messages")
        exchange.client_messages = len(messages)
        system_messages, rest = history.split_system(messages)
        system = history.system_prompt(system_messages)
        key, kind = _key(profile, provider, session_header, system, rest)
        digests, chains = known_digests.prefix((owner.pk, profile.pk, key), rest)
        exchange.key, exchange.kind, exchange.digests, exchange.chains, exchange.rest = key, kind, digests, chains, rest
        def advance(*, defer_summary: bool = False) -> tuple[sessions.PendingTurn, GatewaySession | None]:
            """Find the session and run the hook on what is new, in one short transaction."""
            nonlocal stage
            stage = "identity"
            with transaction.atomic():
                adopting = None
                gateway: GatewaySession | None
                if chained_to is not None:
                    gateway = _locked_row(chained_to.pk)
                    exchange.identity, exchange.forked_from = "chained", None
                    # The request's messages follow the session's history: their chain goes on from its own.
                    stored = gateway.ingested
                    exchange.chains = [*([""] * max(stored.length - 1, 0)), *([stored.chain] if stored.length else []),
                                       *history.chained(digests, start=stored.chain)]
                    exchange.rest = [*([None] * stored.length), *rest]
                else:
                    gateway, exchange.identity, exchange.forked_from = _find(owner, profile, key, kind,
                                                                             session_header, chains, retry=retry)
                if exchange.identity == "forked" and agent_compaction is not None \
                        and exchange.forked_from is not None:
                    gateway = _locked_row(exchange.forked_from.pk)
                    exchange.identity, exchange.forked_from, adopting = "compacted", None, agent_compaction
                session = gateway.session if gateway is not None else sessions.session_new(
                    owner=owner, system_prompt=system, profile=profile, title=_title(kind, key, rest))
                exchange.session = session
                stage = "hook"
                repeat = None
                if gateway is not None and exchange.identity == "repeated":
                    repeat = sessions.session_repeat_pending(session=session)
                    if repeat is None:
                        # What the request leaves out is not a reply the gateway recorded: a fork after all.
                        exchange.identity, exchange.forked_from, gateway = "forked", session, None
                        session = sessions.session_new(owner=owner, system_prompt=system, profile=profile,
                                                       title=_title(kind, key, rest))
                        exchange.session = session
                exchange.history_length = gateway.history_length if gateway is not None else 0
                # Adopting the agent's compaction, everything it sent is new.
                exchange.matched = 0 if adopting is not None else (
                    exchange.history_length if chained_to is not None else min(exchange.history_length, len(digests)))
                # Tool definitions and a structured-output schema are billed as prompt
                # tokens: the engine counts them as a layer of this call's budget.
                pending = repeat or sessions.session_advance_pending(
                    session=session, messages=exchange.rest[exchange.matched:], system_prompt=system,
                    request_schemas=(body.get("tools"), body.get("response_format")),
                    stage_summary=True, defer_summary=defer_summary, agent_compaction=adopting)
                exchange.pending = pending
                if pending.committed:
                    # The hook compacted and its turn is written now: the ingested
                    # history goes with it, in the same transaction.
                    _history_save(exchange, gateway, history.Ingested.of(exchange.chains))
            exchange.gateway = gateway
            return pending, gateway

        pending, gateway = advance()
        if pending.plan is not None:
            # The hook must summarise first: the summary model is called with no
            # transaction open and no lock held, then the turn is written at once.
            pending = _summarised(exchange, pending, gateway)
            if pending.plan is not None or not pending.committed:
                # The session moved during the call: this turn keeps every message.
                pending, gateway = advance(defer_summary=True)
        new = exchange.rest[exchange.matched:]
        payload, trace = pending.payload, pending.trace
        exchange.new = len(new)
        exchange.turn = int(trace["turn"])
        # The client's own system messages go upstream verbatim (role
        # "developer", content parts); the engine's copy is for counting.
        if system and payload and payload[0].get("role") == "system":
            payload = payload[1:]
        upstream_messages = [*system_messages, *payload]
        exchange.body = _managed(provider, body, upstream_messages, add_usage=exchange.stream
                                 and not exchange.client_wants_usage)
        exchange.upstream_messages = len(upstream_messages)
        exchange.managed = True
    except Exception as exc:
        # Whatever broke (bad input the provider may still accept, the engine,
        # the database), the agent's call goes out unmanaged and the failure
        # is written down with the exchange.
        log.warning("gateway: forwarding unmanaged after a %s failure: %s", stage, _describe(exc),
                    exc_info=not isinstance(exc, ContextLabError))
        exchange.managed = False
        exchange.turn = None
        exchange.error_stage = stage
        exchange.error = _describe(exc)
        exchange.body = _unmanaged(provider, body)
        exchange.pending = None
        _forget_unsaved(exchange)
    exchange.prepare_ms = (time.perf_counter() - start) * 1000
    return exchange


def _summarised(exchange: Exchange, pending: sessions.PendingTurn,
                gateway: GatewaySession | None) -> sessions.PendingTurn:
    """Ask the summary model a staged turn's question holding nothing, then write the turn
    (and the ingested history with it) in one short transaction with a version check."""
    assert pending.plan is not None
    try:
        planned = pending.manager.summarize_plan(pending.plan, pending.compactor)
    except BaseException:
        # A bug, not an answer: later turns of the session must not wait for the lease.
        if not pending.session._state.adding:
            AgentSession.objects.filter(pk=pending.session.pk).update(summary_call_until=None)
        raise
    with transaction.atomic():
        # The gateway row first, then the session row: the lock order of every call.
        locked = None if gateway is None else _locked_row(gateway.pk)
        if locked is not None and locked.history_length != exchange.history_length:
            AgentSession.objects.filter(pk=pending.session.pk).update(summary_call_until=None)
            return pending
        if sessions.pending_turn_apply_plan(pending=pending, planned=planned):
            exchange.session = pending.session
            _history_save(exchange, locked, history.Ingested.of(exchange.chains))
    return pending


def _unmanaged(provider: UpstreamProvider, body: dict[str, Any]) -> dict[str, Any]:
    """The client's request with only the model name mapped."""
    out = dict(body)
    if "model" in out:
        out["model"] = provider.upstream_model(out["model"])
    return out


def _managed(provider: UpstreamProvider, body: dict[str, Any], messages: list[dict[str, Any]], *,
             add_usage: bool) -> dict[str, Any]:
    """The client's request with the managed messages; every other parameter is left as it came."""
    out = _unmanaged(provider, body)
    out["messages"] = messages
    if add_usage:
        options = body.get("stream_options")
        out["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    return out


def _key(profile: AgentProfile, provider: UpstreamProvider, session_header: str, system: str,
         rest: list[Any]) -> tuple[str, str]:
    if session_header:
        if len(session_header) > MAX_KEY_LENGTH or not session_header.isprintable():
            raise InvalidMessages(f"the {SESSION_HEADER} header must be at most {MAX_KEY_LENGTH} printable "
                                  "characters", field=SESSION_HEADER)
        return session_header, GatewaySession.Kind.HEADER
    include_system = provider.identity == UpstreamProvider.Identity.SYSTEM_AND_FIRST_USER
    key = history.derived_key(profile_id=profile.pk, system=system, first_user_message=history.first_user(rest),
                              include_system=include_system)
    return key, GatewaySession.Kind.DERIVED


def _title(kind: str, key: str, rest: list[Any]) -> str:
    if kind == GatewaySession.Kind.HEADER and _as_uuid(key) is None:
        return f"gateway · {key}"[:200]
    first = history.first_user(rest)
    text = history.without_reminders(history.content_text(first.get("content"))) if isinstance(first, dict) else ""
    # A title is for people: control characters (NUL included) become spaces.
    text = " ".join("".join(c if c.isprintable() else " " for c in text[:TITLE_CHARS * 4]).split())
    if len(text) > TITLE_CHARS:
        text = text[:TITLE_CHARS - 1] + "…"
    return f"gateway · {text}" if text else "gateway session"


def session_of_response(owner: User, profile: AgentProfile, response_id: str) -> AgentSession | None:
    """The session whose recorded call the provider answered with ``response_id``, or None: the
    gateway never forwarded that call, or did not record it in a session."""
    if not response_id:
        return None
    row = (GatewayExchange.objects.filter(owner=owner, profile=profile, response_id=response_id[:200],
                                          session__isnull=False)
           .exclude(response_id="").order_by("-created").values_list("session_id", flat=True).first())
    return AgentSession.objects.filter(pk=row).defer("engine_state").first() if row is not None else None


def estimate_tokens(chat: dict[str, Any]) -> int:
    """ContextLab's count of a request (chat-completions shape): its messages and tool definitions,
    counted as the engine counts a payload."""
    counter = TiktokenCounter()
    messages = chat.get("messages") or []
    try:
        parsed = from_openai(messages, known_calls={})
    except ContextLabError:
        # A shape the engine refuses still has a size: its text, counted plainly.
        return counter.count_text(json.dumps(messages, ensure_ascii=False))
    tools = chat.get("tools")
    try:
        schemas = schema_tokens(counter, check_tools(tools), None) if tools else 0
    except ContextLabError:
        schemas = counter.count_text(json.dumps(tools, ensure_ascii=False))
    return counter.count_messages(parsed) + schemas + REPLY_PRIMING_TOKENS


def count_record(*, owner: User, profile: AgentProfile, session_header: str, endpoint: str, status_code: int,
                 counted: int | None, estimate: int | None, upstream_ms: float) -> GatewayExchange:
    """A token count the agent asked the provider for, written beside the session it names: the
    provider's number and ContextLab's count of the same request (the token view shows both)."""
    session = named_session(owner, profile, session_header)
    if session is None and session_header:
        # Observe mode: the session the inference put the agent's calls under that name in.
        session_id = (ObservedCall.objects.filter(owner=owner, profile=profile, session_header=session_header[:300],
                                                  session__isnull=False)
                      .order_by("-pk").values_list("session_id", flat=True).first())
        session = AgentSession.objects.filter(pk=session_id).defer("engine_state").first() if session_id else None
    usage = ({"input_tokens": counted, "contextlab_estimate": estimate}
             if counted is not None and estimate is not None else None)
    return GatewayExchange.objects.create(
        owner=owner, profile=profile, session=session, turn_number=(session.turns_count or None) if session else None,
        endpoint=endpoint, managed=False, status_code=status_code, usage=usage, upstream_ms=upstream_ms)


def named_session(owner: User, profile: AgentProfile, key: str) -> AgentSession | None:
    """The newest session under the key the agent names its conversation by, or None: where a
    call that is not managed (the agent's own compaction request) shows."""
    if not key:
        return None
    row = (GatewaySession.objects.filter(owner=owner, key=key, session__profile=profile)
           .select_related("session").defer("session__engine_state").order_by("-updated").first())
    return row.session if row is not None else None


def _find(owner: User, profile: AgentProfile, key: str, kind: str, session_header: str,
          chains: list[str], *, retry: bool = False) -> tuple[GatewaySession | None, str, AgentSession | None]:
    """The session whose ingested history the request continues (its gateway row locked), or None
    for a new one; how it was found; and, for a new one, the session it forks from.

    Among the sessions under the key, the one with the longest history that the
    request starts with wins; when none fits (the client rewound, edited, or
    is a second run of the same task) a new session starts under the same key,
    remembering the one it forked from.
    """
    # The engine state is the session's largest column, and the services load
    # it themselves under their lock; decoding it here too would double the cost.
    candidates = list(GatewaySession.objects.filter(owner=owner, key=key, session__profile=profile)
                      .select_related("session").defer("session__engine_state")
                      .order_by("-updated")[:MAX_CANDIDATES])
    session_id = _as_uuid(session_header) if session_header else None
    if session_id is not None and all(c.session_id != session_id for c in candidates):
        named = AgentSession.objects.filter(pk=session_id, owner=owner, profile=profile).defer("engine_state").first()
        if named is not None:
            # A session created elsewhere (the JSON API), driven through the
            # gateway from now on: its history starts empty here.
            gateway, _ = GatewaySession.objects.get_or_create(
                session=named, defaults={"owner": owner, "key": key, "kind": kind})
            candidates.insert(0, gateway)
    fitting = [c for c in candidates if history.continues_chain(c.ingested, chains)]
    if fitting:
        best = max(fitting, key=lambda c: (c.history_length, c.updated))
        # Lock order everywhere: the gateway row, then the session row (the services' own lock).
        # Another call may have moved the session on while this one looked: the
        # row as read is still good when its last change is the one read (the
        # history column, which grows with the session, is not read twice).
        updated = (GatewaySession.objects.select_for_update(of=("self",)).filter(pk=best.pk)
                   .values_list("updated", flat=True).first())
        if updated == best.updated:
            return best, "continued", None
        locked = (GatewaySession.objects.select_for_update(of=("self",)).select_related("session")
                  .defer("session__engine_state").get(pk=best.pk))
        if history.continues_chain(locked.ingested, chains):
            return locked, "continued", None
    for candidate in candidates if retry else []:
        if history.repeats_chain(candidate.ingested, chains):
            locked = (GatewaySession.objects.select_for_update(of=("self",)).select_related("session")
                      .defer("session__engine_state").get(pk=candidate.pk))
            if history.repeats_chain(locked.ingested, chains):
                return locked, "repeated", None
    if candidates:
        return None, "forked", candidates[0].session
    return None, "new", None


def _history_save(exchange: Exchange, gateway: GatewaySession | None, ingested: history.Ingested) -> None:
    """Store the ingested history of the exchange's session (its gateway row, created for a new session)."""
    assert exchange.session is not None
    if gateway is None:
        row = GatewaySession(session=exchange.session, owner=exchange.owner, key=exchange.key, kind=exchange.kind,
                             forked_from=exchange.forked_from, reply_prepared=exchange.prepared)
        row.ingested = ingested
        row.save(force_insert=True)
        return
    gateway.ingested = ingested
    gateway.updated = now()
    gateway.reply_prepared = exchange.prepared
    gateway.save(update_fields=["history_length", "history_chain", "history_before_last", "updated",
                                "reply_prepared"])


def _forget_unsaved(exchange: Exchange) -> None:
    """A session started for this call that was never saved: its files go, the exchange names no session."""
    if exchange.session is not None and exchange.session._state.adding:
        shutil.rmtree(exchange.session.workspace, ignore_errors=True)
        exchange.session = None
        exchange.turn = None


def exchange_record(exchange: Exchange, *, status_code: int | None, reply: dict[str, Any] | None = None,
                    usage: Any = None, upstream_ms: float = 0.0, error: str = "") -> GatewayExchange | None:
    """Write what the call left behind; never raises (the client's answer is already decided).

    ``reply`` is the provider's assistant message as the client received it: it
    joins the session, and its digest joins the ingested history, so the
    client's next call, which sends it back, continues this session.
    """
    with telemetry.current(exchange.span):
        row = _record(exchange, status_code=status_code, reply=reply, usage=usage, upstream_ms=upstream_ms,
                      error=error)
    if row is not None and exchange.steps and exchange.managed and status_code == 200 and not exchange.error:
        for step in exchange.steps:
            turn_step_add(exchange, step)
    if exchange.span is not None:
        result = exchange.pending.result if exchange.pending is not None else None
        warning = (telemetry.window_warning({"budget": result.trace.budget, "payload": result.trace.payload})
                   if result is not None else "")
        telemetry.finish_gateway_span(exchange.span, status_code=status_code, usage=usage if isinstance(usage, dict)
                                      else None, session_id=row.session_id if row is not None else None,
                                      turn=exchange.turn, managed=exchange.managed, error=exchange.error,
                                      request=exchange.body, reply=reply, warning=warning)
    return row


def unknown_content_step(found: list[tuple[str, str]]) -> dict[str, Any] | None:
    """The content the protocol adapter could not read, as a step of the turn's flow: each
    "unknown <type>", kept verbatim (sent as it came, counted as its JSON, never cut)."""
    if not found:
        return None
    kinds: dict[str, int] = {}
    for kind, _ in found:
        kinds[kind] = kinds.get(kind, 0) + 1
    names = ", ".join(f"unknown {kind}" + (f" ×{count}" if count > 1 else "") for kind, count in kinds.items())
    return {"step": "unknown_content", "status": "warning", "started_at": "", "duration_ms": 0.0, "inputs": {},
            "numbers": {"unknown": len(found)}, "outcome": f"kept verbatim, unread: {names}",
            "reasons": [f"unknown {kind} at {where}" for kind, where in found[:50]],
            "details": {"unknown": [{"type": kind, "at": where} for kind, where in found[:200]]}}


def turn_step_add(exchange: Exchange, step: dict[str, Any]) -> None:
    """Write ``step`` into the trace of the exchange's turn, before its result (replacing one of
    the same name): what the gateway learnt about the call outside the engine's own steps."""
    if exchange.session is None or exchange.turn is None:
        return
    turn = Turn.objects.filter(session=exchange.session, number=exchange.turn).only("pk", "trace").first()
    if turn is None or not isinstance(turn.trace, dict):
        return
    steps = [s for s in turn.trace.get("steps") or [] if s.get("step") != step["step"]]
    result_at = next((i for i, s in enumerate(steps) if s.get("step") == "result"), len(steps))
    steps.insert(result_at, step)
    turn.trace = {**turn.trace, "steps": steps}
    turn.save(update_fields=["trace"])


def _record(exchange: Exchange, *, status_code: int | None, reply: dict[str, Any] | None, usage: Any,
            upstream_ms: float, error: str) -> GatewayExchange | None:
    if error:
        exchange.error_stage = exchange.error_stage or "upstream"
        exchange.error = f"{exchange.error}; {error}" if exchange.error else error
    answered = status_code == 200 and not error
    try:
        with transaction.atomic():
            if exchange.managed and exchange.pending is not None and answered:
                _commit(exchange, reply, _checked_usage(exchange, usage))
                if isinstance(usage, dict) and usage and exchange.turn is not None and \
                        not exchange.pending.usage_written:
                    _usage_report(exchange, usage)
            else:
                # Nothing the call brought joins the session: a retry starts from the same state.
                _forget_unsaved(exchange)
            return _write_row(exchange, status_code=status_code, usage=usage, upstream_ms=upstream_ms)
    except Exception as exc:
        log.exception("gateway: could not record the exchange of session %s",
                      exchange.session.pk if exchange.session else "-")
        exchange.error_stage = "record"
        exchange.error = f"{exchange.error}; {_describe(exc)}" if exchange.error else _describe(exc)
        _forget_unsaved(exchange)
        try:
            return _write_row(exchange, status_code=status_code, usage=usage, upstream_ms=upstream_ms)
        except Exception:
            log.exception("gateway: could not record the failure either")
            return None


def _checked_usage(exchange: Exchange, usage: Any) -> dict[str, Any] | None:
    """The provider's usage when it can go into the turn's row as it is written; None otherwise."""
    if not isinstance(usage, dict) or not usage:
        return None
    try:
        return sessions.check_usage(usage)
    except ContextLabError:
        return None  # _usage_report says why, as a note on the exchange


def _commit(exchange: Exchange, reply: dict[str, Any] | None, usage: dict[str, Any] | None = None) -> None:
    """Write the answered call: the pending turn, the client's new messages and the provider's reply."""
    pending = exchange.pending
    assert pending is not None and exchange.session is not None
    replies = [history.reply_message(reply)] if reply is not None else []
    # The history with the reply: its record is one chain step past the request's.
    reply_chains = [*exchange.chains, *([history.chain_step(exchange.chains[-1] if exchange.chains else "",
                                                            history.digest(reply))] if reply is not None else [])]
    reply_ingested = history.Ingested.of(reply_chains)
    if pending.committed:
        gateway = None if exchange.session._state.adding else _locked_row(exchange.session.pk)
        sessions.pending_turn_commit(pending=pending, reply=replies)
        _history_save(exchange, gateway, reply_ingested)
        return
    if exchange.session._state.adding:
        earlier = _earlier_attempt(exchange) if exchange.retry else None
        if earlier is not None:
            # An earlier attempt of this very request started the session meanwhile.
            shutil.rmtree(exchange.session.workspace, ignore_errors=True)
            _commit_repeat(exchange, earlier, replies, reply_ingested)
            return
        sessions.pending_turn_commit(pending=pending, reply=replies, usage=usage)
        _history_save(exchange, None, reply_ingested)
        return
    # The gateway row first, as in exchange_prepare, so two calls never wait on each other in a cycle.
    gateway = _relocked_row(exchange)
    if gateway.history_length != exchange.history_length:
        if exchange.retry and pending.repeated is None and history.repeats_chain(gateway.ingested, exchange.chains):
            # Another attempt of this very request was answered first.
            _commit_repeat(exchange, gateway, replies, reply_ingested)
            return
        if pending.repeated is not None or not history.continues_chain(gateway.ingested, exchange.chains):
            exchange.notes.append("the session moved while the provider answered; this reply was not recorded")
            return
        # Another call of the same conversation wrote meanwhile: ingest what it did not.
        pending.messages = exchange.rest[gateway.history_length:]
    if not sessions.pending_turn_commit(pending=pending, reply=replies, usage=usage):
        exchange.notes.append("the session moved while the provider answered; the turn was run again")
        exchange.turn = int(AgentSession.objects.values_list("turns_count", flat=True).get(pk=exchange.session.pk))
    _history_save(exchange, gateway, reply_ingested)


def _relocked_row(exchange: Exchange) -> GatewaySession:
    """The exchange's gateway row, locked again: the one read when the call was prepared when
    nothing wrote it since (its history, which grows with the session, is not read again)."""
    assert exchange.session is not None
    known = exchange.gateway
    if known is not None and known.pk == exchange.session.pk:
        updated = (GatewaySession.objects.select_for_update(of=("self",)).filter(pk=known.pk)
                   .values_list("updated", flat=True).first())
        if updated == known.updated:
            return known
    return _locked_row(exchange.session.pk)


def _locked_row(session_id: Any) -> GatewaySession:
    return (GatewaySession.objects.select_for_update(of=("self",)).select_related("session")
            .defer("session__engine_state").get(pk=session_id))


def _earlier_attempt(exchange: Exchange) -> GatewaySession | None:
    """A session under the exchange's key whose recorded reply answers this very request."""
    for candidate in (GatewaySession.objects.filter(owner=exchange.owner, key=exchange.key,
                                                    session__profile=exchange.profile)
                      .defer("session__engine_state").order_by("-updated")[:MAX_CANDIDATES]):
        if history.repeats_chain(candidate.ingested, exchange.chains):
            return _locked_row(candidate.pk)
    return None


def _commit_repeat(exchange: Exchange, gateway: GatewaySession, replies: list[dict[str, Any]],
                   reply_ingested: history.Ingested) -> None:
    """Two attempts of one request were answered: the later-prepared one's reply stands."""
    exchange.session, exchange.identity = gateway.session, "repeated"
    if gateway.reply_prepared is not None and gateway.reply_prepared > exchange.prepared:
        exchange.turn = gateway.session.turns_count
        exchange.notes.append("a later attempt of the same request was answered first; its reply stands")
        return
    repeat = sessions.session_repeat_pending(session=gateway.session)
    if repeat is None or repeat.repeated is None:
        exchange.turn = None
        exchange.notes.append("the session moved while the provider answered; this reply was not recorded")
        return
    exchange.turn = repeat.repeated.number
    sessions.pending_turn_commit(pending=repeat, reply=replies)
    _history_save(exchange, gateway, reply_ingested)


def _usage_report(exchange: Exchange, usage: dict[str, Any]) -> None:
    assert exchange.session is not None and exchange.turn is not None
    try:
        # A savepoint: usage a provider shapes oddly must not undo the reply.
        with transaction.atomic():
            sessions.usage_report(session=exchange.session, turn_number=exchange.turn, usage=usage)
    except ContextLabError as exc:
        exchange.notes.append(f"usage not stored: {exc.message}")


def _write_row(exchange: Exchange, *, status_code: int | None, usage: Any, upstream_ms: float) -> GatewayExchange:
    row = GatewayExchange.objects.create(
        owner=exchange.owner, profile=exchange.profile, session=exchange.session, turn_number=exchange.turn,
        endpoint=exchange.endpoint, stream=exchange.stream, model=exchange.model,
        upstream_model=str(exchange.body.get("model") or "")[:200], managed=exchange.managed,
        identity=exchange.identity, client_messages=exchange.client_messages, matched_messages=exchange.matched,
        new_messages=exchange.new, upstream_messages=exchange.upstream_messages, status_code=status_code,
        error_stage=exchange.error_stage, error="; ".join([exchange.error, *exchange.notes]).strip("; "),
        prepare_ms=exchange.prepare_ms, upstream_ms=upstream_ms, usage=usage if isinstance(usage, dict) else None,
        response_id=exchange.response_id[:200])
    if exchange.error_stage in ("identity", "hook", "record") and exchange.session is not None:
        # The sessions list's "had a failure" filter then shows gateway trouble too.
        AgentSession.objects.filter(pk=exchange.session.pk).update(failures_count=F("failures_count") + 1)
    return row
