"""The gateway's own tables: where a profile's calls go, which client
conversation is which session, and one row per call passed through.

The sessions app stays untouched: an ``UpstreamProvider`` hangs off an
``AgentProfile`` one-to-one, a ``GatewaySession`` off an ``AgentSession``.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils.timezone import now

from contextlab.gateway import history, trust
from contextlab.sessions.models import AgentProfile, AgentSession
from contextlab.support import providers

log = logging.getLogger(__name__)


class UpstreamMisconfigured(Exception):
    """The provider row cannot be used as it is (its key variable is not set, say)."""


class UpstreamProvider(models.Model):
    """The real OpenAI-compatible provider behind one agent profile."""

    class Identity(models.TextChoices):
        SYSTEM_AND_FIRST_USER = "system+first_user", "system prompt and first user message"
        FIRST_USER = "first_user", "first user message only (the system prompt changes between calls)"

    profile = models.OneToOneField(AgentProfile, models.CASCADE, related_name="upstream")
    base_url = models.URLField(max_length=500, help_text="the provider's OpenAI-compatible base URL, "
                                                         "e.g. https://api.openai.com/v1")
    api_key_env = models.CharField(
        max_length=100, blank=True,
        help_text="name of the environment variable holding the provider key; wins over a stored key")
    # Encrypted (contextlab.support.providers.encrypt_secret); set it with ``store_api_key``.
    api_key = models.CharField(
        max_length=1000, blank=True,
        help_text="the provider key, stored encrypted (leave empty when the variable above is used)")
    model_map = models.JSONField(
        default=dict, blank=True,
        help_text='client model name → provider model name, e.g. {"gpt-4o": "my-deployment"}; '
                  '"*" maps every other name; unmapped names are sent as they are')
    timeout = models.FloatField(default=600.0, validators=[MinValueValidator(1.0), MaxValueValidator(3600.0)],
                                help_text="seconds to wait for the provider (per read, and to connect)")
    extra_headers = models.JSONField(default=dict, blank=True,
                                     help_text="headers added to every upstream request, name → value")
    identity = models.CharField(
        max_length=32, choices=Identity.choices, default=Identity.SYSTEM_AND_FIRST_USER,
        help_text="what names a conversation when the client sends no X-ContextLab-Session header")

    class Mode(models.TextChoices):
        MANAGE = "manage", "manage: ContextLab manages the context it sends upstream"
        OBSERVE = "observe", "observe: forward unchanged, record, infer what the agent's own context manager did"

    mode = models.CharField(max_length=16, choices=Mode.choices, default=Mode.MANAGE,
                            help_text="observe suits an agent that manages its own context (CoPaw, Claude Code, "
                                      "OpenHands, ...): requests and replies pass byte for byte")

    class Kind(models.TextChoices):
        OPENAI = "openai", "OpenAI-compatible (chat completions; Authorization: Bearer)"
        ANTHROPIC = "anthropic", "Anthropic Messages API (x-api-key, anthropic-version)"

    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.OPENAI,
                            help_text="the wire protocol the provider speaks; an anthropic provider's base URL is "
                                      "e.g. https://api.anthropic.com/v1")

    class ContextEdits(models.TextChoices):
        PROVIDER = "provider", "the provider applies them (Anthropic's API does)"
        ENGINE = "engine", "ContextLab applies them before the call and answers applied_edits (manage mode)"

    context_edits = models.CharField(
        max_length=16, choices=ContextEdits.choices, default=ContextEdits.PROVIDER,
        help_text="who runs an Anthropic request's context_management.edits (clear_tool_uses_*, clear_thinking_*); "
                  "engine suits an Anthropic-compatible upstream that cannot")

    class Credential(models.TextChoices):
        STORED = "stored", "the provider key stored here (the client authenticates with its ContextLab token)"
        CLIENT = "client", "the client's own provider credential, forwarded as it came"

    credential = models.CharField(
        max_length=16, choices=Credential.choices, default=Credential.STORED,
        help_text="client: the agent sends its own provider key or subscription token (x-api-key or "
                  "Authorization) and its ContextLab token in the X-ContextLab-Token header")
    created = models.DateTimeField(default=now)
    updated = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.profile.name} → {self.base_url}"

    def clean(self) -> None:
        if not isinstance(self.model_map, dict) or not all(
                isinstance(k, str) and isinstance(v, str) and v for k, v in self.model_map.items()):
            raise ValidationError({"model_map": "an object of model names: {\"client name\": \"provider name\"}"})
        if not isinstance(self.extra_headers, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in self.extra_headers.items()):
            raise ValidationError({"extra_headers": "an object of header names and string values"})
        errors = {}
        if self.base_url and (problem := trust.base_url_problem(self.base_url)):
            errors["base_url"] = problem
        if problem := trust.api_key_env_problem(self.api_key_env):
            errors["api_key_env"] = problem
        if errors:
            raise ValidationError(errors)

    def upstream_model(self, model: Any) -> Any:
        """The provider's name for the model the client asked for."""
        mapping = self.model_map if isinstance(self.model_map, dict) else {}
        if isinstance(model, str) and model in mapping:
            return mapping[model]
        return mapping.get("*", model)

    def store_api_key(self, key: str) -> None:
        self.api_key = providers.encrypt_secret(key)

    def resolve_api_key(self) -> str:
        """The key to send to this provider only; "" sends none (local providers often need none)."""
        if self.api_key_env:
            # A name outside the prefix (a row written around the admin) is never read.
            allowed = trust.api_key_env_problem(self.api_key_env) is None
            value = os.environ.get(self.api_key_env) if allowed else None
            if not value:
                # The variable's name is for the operator's log, never for the caller.
                log.error("upstream provider %s (profile %s): the environment variable %s is %s",
                          self.pk, self.profile_id, self.api_key_env,
                          "not set" if allowed else f"not a provider key (not {trust.API_KEY_ENV_PREFIX}*)")
                raise UpstreamMisconfigured(
                    f"the upstream provider of profile {self.profile.name!r} has no API key configured on "
                    "the ContextLab server; ask the operator")
            return value
        try:
            return providers.decrypt_secret(self.api_key)
        except providers.ProviderUnavailable as exc:
            raise UpstreamMisconfigured(f"the upstream provider of profile {self.profile.name!r}: "
                                        f"{exc.message}") from exc

    @property
    def forwards_client_credential(self) -> bool:
        return self.credential == self.Credential.CLIENT

    @property
    def chat_url(self) -> str:
        return self.base_url.rstrip("/") + "/chat/completions"

    def url(self, path: str) -> str:
        return self.base_url.rstrip("/") + "/" + path.lstrip("/")


class GatewaySession(models.Model):
    """A session the gateway drives, with the client-side history it has ingested.

    The history is one content digest per client message already ingested (the
    system prompt excluded), in order, plus one for each reply the gateway
    recorded; the row keeps it chained (``history.chained``), so its size does not
    grow with the conversation: the number of messages, the chained digest of all
    of them and of all but the last. A request whose first ``history_length``
    messages chain to ``history_chain`` continues the session; the rest are new.
    """

    class Kind(models.TextChoices):
        HEADER = "header", "X-ContextLab-Session header"
        DERIVED = "derived", "derived from the first messages"

    session = models.OneToOneField(AgentSession, models.CASCADE, primary_key=True, related_name="gateway")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, models.CASCADE, related_name="+")
    # Several sessions may share a key: a client that rewinds or edits its
    # history gets a new session under the same key (see ``forked_from``).
    key = models.CharField(max_length=300)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    history_length = models.PositiveIntegerField(default=0)
    history_chain = models.CharField(max_length=64, blank=True, default="")
    history_before_last = models.CharField(max_length=64, blank=True, default="")
    # When the call whose reply ends ``history`` was prepared: of two attempts of one
    # request (a client retried before the first was answered), the later one's reply stands.
    reply_prepared = models.DateTimeField(null=True, blank=True)
    forked_from = models.ForeignKey(AgentSession, models.SET_NULL, null=True, blank=True, related_name="+")
    created = models.DateTimeField(default=now)
    updated = models.DateTimeField(default=now)

    class Meta:
        indexes = [models.Index(fields=["owner", "key", "-updated"], name="gatewaysession_owner_key")]

    def __str__(self) -> str:
        return f"{self.kind} {self.key[:40]} → {self.session_id}"

    @property
    def ingested(self) -> history.Ingested:
        return history.Ingested(self.history_length, self.history_chain, self.history_before_last)

    @ingested.setter
    def ingested(self, value: history.Ingested) -> None:
        self.history_length, self.history_chain, self.history_before_last = value.length, value.chain, value.before_last


class GatewayExchange(models.Model):
    """One call through the gateway: what was sent where, and what went wrong.

    The row is written for managed and unmanaged calls alike, so the admin (and
    any page) can show "this call went out without context management, because …".
    """

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, models.CASCADE, related_name="+")
    profile = models.ForeignKey(AgentProfile, models.SET_NULL, null=True, blank=True, related_name="+")
    session = models.ForeignKey(AgentSession, models.CASCADE, null=True, blank=True,
                                related_name="gateway_exchanges")
    turn_number = models.PositiveIntegerField(null=True, blank=True)
    endpoint = models.CharField(max_length=32, default="chat.completions")
    stream = models.BooleanField(default=False)
    model = models.CharField(max_length=200, blank=True)
    upstream_model = models.CharField(max_length=200, blank=True)
    managed = models.BooleanField(default=True, help_text="false: forwarded as the client sent it")
    identity = models.CharField(max_length=32, blank=True, help_text="how the session was found")
    client_messages = models.PositiveIntegerField(default=0)
    matched_messages = models.PositiveIntegerField(default=0, help_text="client messages already ingested")
    new_messages = models.PositiveIntegerField(default=0)
    upstream_messages = models.PositiveIntegerField(default=0)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error_stage = models.CharField(max_length=16, blank=True)
    error = models.TextField(blank=True)
    prepare_ms = models.FloatField(default=0.0, help_text="identity, ingest and hook")
    upstream_ms = models.FloatField(default=0.0)
    usage = models.JSONField(null=True, blank=True)
    # The provider's id for its answer (the Responses API's ``id``): a later call that continues it
    # (``previous_response_id``) is found in the session this call was recorded in.
    response_id = models.CharField(max_length=200, blank=True)
    created = models.DateTimeField(default=now)

    class Meta:
        ordering = ["-created"]
        indexes = [models.Index(fields=["session", "-created"], name="gatewayexchange_session"),
                   models.Index(fields=["owner", "response_id"], name="gatewayexchange_response",
                                condition=~models.Q(response_id=""))]

    def __str__(self) -> str:
        return f"{self.endpoint} {self.status_code or '-'} {'managed' if self.managed else 'unmanaged'}"

    @property
    def failed(self) -> bool:
        return bool(self.error)


class ObservedCall(models.Model):
    """One chat-completions call forwarded unchanged in observe mode: the record the inference reads.

    Sessions of observed agents are derived from these rows (rebuilt on each
    call), so the rows, not the sessions, are the source of truth.
    """

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, models.CASCADE, related_name="+")
    profile = models.ForeignKey(AgentProfile, models.CASCADE, related_name="observed_calls")
    session = models.ForeignKey(AgentSession, models.SET_NULL, null=True, blank=True, related_name="observed_calls")
    conversation = models.CharField(max_length=64, blank=True, help_text="the inference's conversation id")
    side_call = models.BooleanField(default=False, help_text="the agent's own context manager calling the LLM")
    session_header = models.CharField(max_length=300, blank=True)
    body = models.JSONField(help_text="the request as the agent sent it")
    reply_text = models.TextField(blank=True)
    reply_tool_calls = models.JSONField(default=list, blank=True)
    usage = models.JSONField(null=True, blank=True)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    upstream_ms = models.FloatField(default=0.0)
    # The context edits the provider reported it applied (Anthropic's ``context_management``
    # of the answer); the edits asked for are in ``body``.
    provider_edits = models.JSONField(null=True, blank=True)
    # "<trace id>/<span id>" of a call received as an OpenTelemetry span: an exporter
    # sends a batch again when its answer was lost, and the span is recorded once.
    span = models.CharField(max_length=100, blank=True)
    # The wire protocol and endpoint the call came in ("chat.completions", "responses",
    # "responses.compact", "anthropic.messages"): how ``body`` and the reply read; the
    # inference reads every protocol through its adapter's conversion.
    endpoint = models.CharField(max_length=32, default="chat.completions")
    # The provider's id of the answer (Responses API), which a later call's previous_response_id names.
    response_id = models.CharField(max_length=200, blank=True)
    # What the agent said the call was for, beside a turn: "compaction.local", "compaction.remote", "prewarm".
    kind = models.CharField(max_length=32, blank=True)
    # Identity evidence beside the messages (``contextlab.engine.observe.inference.identity_score``):
    # the conversation id a gateway adapter read from the client (Claude Code's,
    # Codex's session id), the caller's trace, a digest of the sender's resource.
    client_id = models.CharField(max_length=300, blank=True)
    trace_id = models.CharField(max_length=32, blank=True)
    resource = models.CharField(max_length=64, blank=True)
    created = models.DateTimeField(default=now)

    class Meta:
        ordering = ["pk"]
        indexes = [models.Index(fields=["owner", "profile", "id"], name="observedcall_profile")]
        constraints = [models.UniqueConstraint(fields=["owner", "profile", "span"], condition=~models.Q(span=""),
                                               name="observedcall_one_row_per_span")]

    def __str__(self) -> str:
        return f"observed call {self.pk} ({self.status_code or '-'})"
