"""Agent profiles and sessions, and everything a session's turns leave behind.

The engine does the work and keeps its own state: a small header in
``AgentSession.engine_state`` (``ContextManager.export_header()``, plus where the live
order is kept), each live message's form in its ``SessionMessage`` row and each tool call
in a ``SessionCall`` row; the other tables are the
queryable record the pages and the API read: one row per message with its fate,
one per turn with its trace, one per summary version, offloaded file and
manual compaction run.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import uuid
from collections.abc import Collection
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models, transaction
from django.urls import reverse
from django.utils.timezone import now

from contextlab.engine.compactors import Compactor, build_compactor
from contextlab.engine.core.errors import InvalidProfile
from contextlab.engine.core.paths import UnsafePath, workspace_path
from contextlab.engine.core.profile import (
    BOUNDS,
    COMPACTORS,
    CONSTRAINED_OUTPUTS,
    EVICTION_STRATEGIES,
    LANGUAGES,
    POLICIES,
    TOKENIZERS,
    Profile,
    bound_problem,
)
from contextlab.lib.textsafe import RepairingJSONDecoder
from contextlab.sessions import payload_delta
from contextlab.support import providers

log = logging.getLogger(__name__)

_DEFAULT = Profile()
# Every knob of the engine's Profile, in its order; "name" is the row's own
# field and "extra" is free-form engine data, not a knob.
# Where the summary model lives and which secret it gets are the operator's
# choice (contextlab.support.providers): a stored profile names a provider instead.
OPERATOR_KNOBS: tuple[str, ...] = ("compaction_base_url", "compaction_api_key_env")
PROFILE_KNOBS: tuple[str, ...] = tuple(
    "compaction_provider" if f.name == "compaction_base_url" else f.name
    for f in dataclasses.fields(Profile) if f.name not in ("name", "extra", "compaction_api_key_env"))
LIST_KNOBS: tuple[str, ...] = ("exempt_tool_names", "browser_tool_names", "read_file_tool_names")
# Outcomes that count as a failure on the sessions list ("had a failure / fallback").
FAILURE_OUTCOMES = ("compaction_failed", "fallback_summary")
COMPACTION_OUTCOMES = ("compacted", "fallback_summary")


def _bounded(name: str) -> list[Any]:
    bound = BOUNDS[name]
    return [MinValueValidator(bound.low), MaxValueValidator(bound.high)]


def _choices(values: tuple[str, ...]) -> list[tuple[str, str]]:
    return [(v, v) for v in values]


def default_browser_tool_names() -> list[str]:
    return list(_DEFAULT.browser_tool_names)


def default_read_file_tool_names() -> list[str]:
    return list(_DEFAULT.read_file_tool_names)


# The ``source.format`` of sessions rebuilt from what an agent sent rather than managed here.
OBSERVED_FORMATS = ("observed", "otlp", "requests", "copaw_workspace")

class AgentProfile(models.Model):
    """The knobs of one agent, stored; ``to_engine()`` gives the engine's Profile."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, models.CASCADE, related_name="agent_profiles")
    name = models.CharField(max_length=100)
    policy = models.CharField(max_length=16, choices=_choices(POLICIES), default=_DEFAULT.policy)
    max_input_length = models.PositiveIntegerField(
        default=_DEFAULT.max_input_length, validators=_bounded("max_input_length"),
        help_text=BOUNDS["max_input_length"].help)
    compact_ratio = models.FloatField(
        default=_DEFAULT.compact_ratio, validators=_bounded("compact_ratio"), help_text=BOUNDS["compact_ratio"].help)
    reserve_ratio = models.FloatField(
        default=_DEFAULT.reserve_ratio, validators=_bounded("reserve_ratio"), help_text=BOUNDS["reserve_ratio"].help)
    recent_n = models.PositiveIntegerField(
        default=_DEFAULT.recent_n, validators=_bounded("recent_n"), help_text=BOUNDS["recent_n"].help)
    recent_max_bytes = models.PositiveIntegerField(
        default=_DEFAULT.recent_max_bytes, validators=_bounded("recent_max_bytes"),
        help_text=BOUNDS["recent_max_bytes"].help)
    old_max_bytes = models.PositiveIntegerField(
        default=_DEFAULT.old_max_bytes, validators=_bounded("old_max_bytes"), help_text=BOUNDS["old_max_bytes"].help)
    markdown_recent_max_bytes = models.PositiveIntegerField(
        default=_DEFAULT.markdown_recent_max_bytes, validators=_bounded("markdown_recent_max_bytes"),
        help_text=BOUNDS["markdown_recent_max_bytes"].help)
    markdown_old_max_bytes = models.PositiveIntegerField(
        default=_DEFAULT.markdown_old_max_bytes, validators=_bounded("markdown_old_max_bytes"),
        help_text=BOUNDS["markdown_old_max_bytes"].help)
    retention_days = models.PositiveIntegerField(
        default=_DEFAULT.retention_days, validators=_bounded("retention_days"),
        help_text=BOUNDS["retention_days"].help)
    tokenizer = models.CharField(max_length=32, choices=_choices(TOKENIZERS), default=_DEFAULT.tokenizer)
    estimate_divisor = models.FloatField(
        default=_DEFAULT.estimate_divisor, validators=_bounded("estimate_divisor"),
        help_text=BOUNDS["estimate_divisor"].help)
    compactor = models.CharField(max_length=16, choices=_choices(COMPACTORS), default=_DEFAULT.compactor)
    compaction_provider = models.CharField(
        max_length=64, blank=True, default="",
        help_text="which of the server's providers serves the summary model (the operator lists them)")
    compaction_model = models.CharField(max_length=200, blank=True, default=_DEFAULT.compaction_model)
    compaction_timeout = models.FloatField(
        default=_DEFAULT.compaction_timeout, validators=_bounded("compaction_timeout"),
        help_text=BOUNDS["compaction_timeout"].help)
    compaction_retries = models.PositiveSmallIntegerField(
        default=_DEFAULT.compaction_retries, validators=_bounded("compaction_retries"),
        help_text=BOUNDS["compaction_retries"].help)
    compaction_constrained_output = models.CharField(
        max_length=16, choices=_choices(CONSTRAINED_OUTPUTS), default=_DEFAULT.compaction_constrained_output,
        help_text="make the summary model's server emit the six headings (grammar: llama.cpp only; "
                  "json_schema: servers with structured outputs); structure only, not quality")
    summary_language = models.CharField(max_length=8, choices=_choices(LANGUAGES), default=_DEFAULT.summary_language)
    exempt_tool_names = models.JSONField(default=list, blank=True, help_text="tools whose results are never cut")
    browser_tool_names = models.JSONField(default=default_browser_tool_names, blank=True,
                                          help_text="tools whose old results keep only the file reference")
    read_file_tool_names = models.JSONField(default=default_read_file_tool_names, blank=True,
                                            help_text="tools whose results point at the real file and line")
    timezone = models.CharField(max_length=64, default=_DEFAULT.timezone)
    max_message_bytes = models.PositiveIntegerField(
        default=_DEFAULT.max_message_bytes, validators=_bounded("max_message_bytes"),
        help_text=BOUNDS["max_message_bytes"].help)
    eviction_strategy = models.CharField(max_length=32, choices=_choices(EVICTION_STRATEGIES),
                                         default=_DEFAULT.eviction_strategy,
                                         help_text="which units the eviction policy removes first")
    eviction_target_ratio = models.FloatField(
        default=_DEFAULT.eviction_target_ratio, validators=_bounded("eviction_target_ratio"),
        help_text=BOUNDS["eviction_target_ratio"].help)
    eviction_weight_relevance = models.FloatField(
        default=_DEFAULT.eviction_weight_relevance, validators=_bounded("eviction_weight_relevance"),
        help_text=BOUNDS["eviction_weight_relevance"].help)
    eviction_weight_recency = models.FloatField(
        default=_DEFAULT.eviction_weight_recency, validators=_bounded("eviction_weight_recency"),
        help_text=BOUNDS["eviction_weight_recency"].help)
    eviction_weight_density = models.FloatField(
        default=_DEFAULT.eviction_weight_density, validators=_bounded("eviction_weight_density"),
        help_text=BOUNDS["eviction_weight_density"].help)
    # Bumped by every saved change of a knob or the name; each value has its
    # ProfileVersion row (who, when, what changed), and each turn records the
    # value it ran under.
    version = models.PositiveIntegerField(default=1, editable=False)
    created = models.DateTimeField(default=now)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["owner", "name"], name="agentprofile_owner_name_unique")]

    def __str__(self) -> str:
        return self.name

    def knobs(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in PROFILE_KNOBS}

    def recorded_values(self) -> dict[str, Any]:
        """The name and every knob as JSON values: what a version records and compares."""
        values: dict[str, Any] = json.loads(json.dumps({"name": self.name, **self.knobs()}, default=str))
        return values

    def save(self, *args: Any, changed_by: Any = None, change_source: str = "code", **kwargs: Any) -> None:
        """Save, and record the change as a new version when a knob or the name changed.

        Every way of changing a profile (the form, the admin, the API, a shell)
        goes through here, so the history cannot miss one; the callers that know
        who changed it and from where say so (``changed_by``, ``change_source``).
        """
        with transaction.atomic():
            if self._state.adding or self.pk is None:
                super().save(*args, **kwargs)
                ProfileVersion.objects.create(profile=self, number=self.version, changed_by=changed_by,
                                              source=change_source, changes=[], values=self.recorded_values())
                return
            # Locked, so two concurrent saves get two version numbers, in order.
            stored = AgentProfile.objects.select_for_update().filter(pk=self.pk).first()
            changes = profile_changes(stored.recorded_values(), self.recorded_values()) if stored else []
            if stored is not None and changes:
                self.version = stored.version + 1
                if kwargs.get("update_fields") is not None:
                    kwargs["update_fields"] = {*kwargs["update_fields"], "version"}
            super().save(*args, **kwargs)
            if changes:
                ProfileVersion.objects.create(profile=self, number=self.version, changed_by=changed_by,
                                              source=change_source, changes=changes,
                                              values=self.recorded_values())

    def to_engine(self) -> Profile:
        """The engine's Profile. It carries the provider's URL (shown in traces) and
        never a key variable: ``summary_compactor`` hands the engine the key itself."""
        values = self.knobs()
        for name in LIST_KNOBS:
            value = values[name]
            if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
                raise InvalidProfile(f"{name} must be a list of tool names", field=name)
            values[name] = tuple(value)
        known = providers.configured().get(values.pop("compaction_provider"))
        base_url = known.base_url if known is not None and self.compactor == "openai" else ""
        return Profile(name=self.name, compaction_base_url=base_url, compaction_api_key_env="", **values)

    def summary_compactor(self) -> Compactor | None:
        """The compactor to give the engine: the provider's, with its key; None for the offline one.

        Raises ``ProviderUnavailable`` when the provider is gone or has no key."""
        if self.compactor != "openai":
            return None
        provider = providers.provider_named(self.compaction_provider)
        return build_compactor("openai", base_url=provider.base_url, model=self.compaction_model,
                               api_key=provider.api_key(), timeout=self.compaction_timeout,
                               retries=self.compaction_retries)

    def clean_fields(self, exclude: Collection[str] | None = None) -> None:
        # Django's own range checks (a positive integer's "≥ 0") and the bound validators each
        # add a message: a bounded knob gets the engine's one message, with the real bound and why.
        try:
            super().clean_fields(exclude=exclude)
        except ValidationError as exc:
            errors = exc.update_error_dict({})
            for name in errors.keys() & BOUNDS.keys():
                problem = bound_problem(name, getattr(self, name))
                errors[name] = [ValidationError(problem.message if problem else errors[name][0].message)]
            raise ValidationError(errors) from exc

    def clean(self) -> None:
        # The engine owns the rules (bounds, and combinations such as reserve ≥
        # threshold), so the form and the admin ask it rather than repeat them;
        # every problem at once, one per field.
        errors: dict[str, list[str]] = {}
        if self.compactor == "openai" or self.compaction_provider:
            try:
                providers.provider_named(self.compaction_provider)
            except InvalidProfile as exc:
                errors.setdefault(exc.field if exc.field in PROFILE_KNOBS else NON_FIELD_ERRORS, [exc.message])
        values = self.knobs()
        for name in LIST_KNOBS:
            value = values[name]
            if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
                errors.setdefault(name, [f"{name} must be a list of tool names"])
            else:
                values[name] = tuple(value)
        values.pop("compaction_provider")
        for problem in Profile.problems_of(name=self.name, compaction_base_url="", compaction_api_key_env="",
                                           **values):
            if problem.field in BOUNDS and bound_problem(problem.field, getattr(self, problem.field)) is not None:
                continue  # the field's own validators said so (``clean_fields``): one message
            errors.setdefault(problem.field if problem.field in PROFILE_KNOBS else NON_FIELD_ERRORS,
                              [problem.message])
        if errors:
            raise ValidationError(errors)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.pk, "name": self.name, **self.knobs(),
                "threshold": self.threshold, "reserve": self.reserve}

    @property
    def threshold(self) -> int:
        return self.to_engine().threshold

    @property
    def reserve(self) -> int:
        return self.to_engine().reserve


def profile_changes(old: dict[str, Any], new: dict[str, Any]) -> list[dict[str, Any]]:
    """What changed between two recorded states of a profile: ``{field, old, new}`` each, in field order."""
    return [{"field": name, "old": old.get(name), "new": value}
            for name, value in new.items() if old.get(name) != value]


class ProfileVersion(models.Model):
    """One saved state of a profile: who made it, when, from where, and what changed."""

    class Source(models.TextChoices):
        FORM = "form"
        ADMIN = "admin"
        API = "api"
        CODE = "code"

    profile = models.ForeignKey(AgentProfile, models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    changed_by = models.ForeignKey(settings.AUTH_USER_MODEL, models.SET_NULL, null=True, blank=True,
                                   related_name="+")
    source = models.CharField(max_length=16, default=Source.CODE)
    # [{"field", "old", "new"}]; empty for the first version (the profile's creation).
    changes = models.JSONField(default=list, blank=True)
    # The name and every knob after this change.
    values = models.JSONField(default=dict)
    created = models.DateTimeField(default=now)

    class Meta:
        ordering = ["-number"]
        constraints = [models.UniqueConstraint(fields=["profile", "number"], name="profileversion_profile_number_unique")]

    def __str__(self) -> str:
        return f"{self.profile_id} v{self.number}"

    def get_absolute_url(self) -> str:
        return reverse("cl-profile-version", args=[self.profile_id, self.number])


class AgentSessionQuerySet(models.QuerySet["AgentSession"]):
    def listed(self, *, profile_id: int | None = None, failed: bool = False) -> AgentSessionQuerySet:
        """The sessions list's filters: by profile, and "had a failure / fallback"."""
        qs = self.select_related("profile")
        if profile_id is not None:
            qs = qs.filter(profile_id=profile_id)
        if failed:
            qs = qs.filter(failures_count__gt=0)
        return qs


class AgentSession(models.Model):
    class Status(models.TextChoices):
        ACTIVE = "active"
        IMPORTING = "importing"
        CLOSED = "closed"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, models.CASCADE, related_name="agent_sessions")
    profile = models.ForeignKey(AgentProfile, models.PROTECT, related_name="sessions")
    title = models.CharField(max_length=200, blank=True)
    system_prompt = models.TextField(blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ACTIVE)
    # The engine's state header (export_header(), and "live": the live order is the
    # rows' seq order, or "live_ids" when a step reordered them); the live messages
    # are in their rows (SessionMessage.live_form), the tool calls in SessionCall rows.
    # Sessions saved before that hold the whole state here, which loads as well.
    engine_state = models.JSONField(default=dict, blank=True, decoder=RepairingJSONDecoder)
    summary = models.TextField(blank=True)
    summary_version = models.PositiveIntegerField(default=0)
    # Numbers for the sessions list, kept current by the services so the list
    # never has to aggregate turns.
    tokens_used = models.PositiveIntegerField(default=0)
    tokens_threshold = models.PositiveIntegerField(default=0)
    tokens_window = models.PositiveIntegerField(default=0)
    turns_count = models.PositiveIntegerField(default=0)
    compactions_count = models.PositiveIntegerField(default=0)
    failures_count = models.PositiveIntegerField(default=0)
    messages_count = models.PositiveIntegerField(default=0)
    live_count = models.PositiveIntegerField(default=0)
    # Where an imported session came from: format, file name, importer warnings.
    source = models.JSONField(default=dict, blank=True, decoder=RepairingJSONDecoder)
    # Bumped by every commit of the engine's state: a process holding an
    # engine of this version may reuse it instead of loading the state again.
    state_version = models.PositiveBigIntegerField(default=0)
    # What the session page's live panels show (the gauge's inputs, whether a
    # manual compaction would do anything), written by the commit that made it
    # true, by the process that held the engine: a page reads it instead of the
    # turn and message rows, and never loads an engine for it. Valid while its
    # "version" is ``state_version`` (see ``services.live_view``).
    live_view = models.JSONField(default=dict, blank=True)
    # Set while a summary call for this session runs with no lock held (the
    # call's bound): turns arriving meanwhile do not start a second one.
    summary_call_until = models.DateTimeField(null=True, blank=True)
    created = models.DateTimeField(default=now)
    last_activity = models.DateTimeField(default=now)

    objects = AgentSessionQuerySet.as_manager()

    class Meta:
        ordering = ["-last_activity"]
        indexes = [models.Index(fields=["owner", "-last_activity"], name="agentsession_owner_activity")]

    def __str__(self) -> str:
        return self.display_title

    @property
    def display_title(self) -> str:
        return self.title or f"Session {str(self.id)[:8]}"

    @property
    def is_observed(self) -> bool:
        """Rebuilt from what an agent sent (observe mode, OTLP, a request log, a CoPaw workspace):
        the agent managed its own context, the profile's policy decided nothing."""
        return isinstance(self.source, dict) and self.source.get("format") in OBSERVED_FORMATS

    @property
    def workspace(self) -> Path:
        return Path(settings.WORKSPACES_DIR) / str(self.id)

    def workspace_file(self, relative: str) -> Path | None:
        """The workspace file a stored path names, or None when that path leads outside the workspace.

        Paths in rows came from the engine or from an imported bundle: they are
        checked, never joined blindly.
        """
        try:
            return workspace_path(self.workspace, relative)
        except UnsafePath:
            return None

    @property
    def had_failure(self) -> bool:
        return self.failures_count > 0

    @property
    def used_percent(self) -> float:
        return min(100.0, 100.0 * self.tokens_used / self.tokens_window) if self.tokens_window else 0.0

    @property
    def over_threshold(self) -> bool:
        return bool(self.tokens_threshold) and self.tokens_used >= self.tokens_threshold

    def get_absolute_url(self) -> str:
        return reverse("cl-session-detail", args=[self.id])

    def latest_turn(self) -> Turn | None:
        return self.turns.defer("payload").order_by("-number").first()

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "title": self.title,
            "profile": {"id": self.profile_id, "name": self.profile.name},
            "status": self.status,
            "policy": self.profile.policy,
            "tokens": {"used": self.tokens_used, "threshold": self.tokens_threshold, "window": self.tokens_window},
            "turns": self.turns_count,
            "compactions": self.compactions_count,
            "failures": self.failures_count,
            "messages": self.messages_count,
            "live_messages": self.live_count,
            "summary_version": self.summary_version,
            "source": self.source or None,
            "created": self.created.isoformat(),
            "last_activity": self.last_activity.isoformat(),
            "url": self.get_absolute_url(),
        }


class SessionMessage(models.Model):
    """Every message a session ever ingested, with where it is now."""

    class Status(models.TextChoices):
        LIVE = "live"
        ARCHIVED = "archived"

    session = models.ForeignKey(AgentSession, models.CASCADE, related_name="messages")
    message_id = models.CharField(max_length=200)
    seq = models.PositiveIntegerField(help_text="position in ingest order, from 1")
    role = models.CharField(max_length=16)
    # Free text from the client (AgentScope names, provider timestamps): no length limit.
    name = models.TextField(blank=True)
    timestamp = models.TextField(blank=True)
    # The engine's own JSON form of the content blocks: as ingested (before any
    # truncation), and as the live context holds it now (or held it last).
    content = models.JSONField(decoder=RepairingJSONDecoder)
    current_content = models.JSONField(decoder=RepairingJSONDecoder)
    tokens = models.PositiveIntegerField(default=0, help_text="exact tokens of the current content")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.LIVE)
    # Stage 1 = cut when written into the context; 2 = re-cut in the hook
    # (also CoPaw's in-hook cut, which has no separate stages).
    truncated_stage = models.PositiveSmallIntegerField(null=True, blank=True)
    truncated_turn = models.PositiveIntegerField(null=True, blank=True)
    compacted_turn = models.PositiveIntegerField(null=True, blank=True)
    summary_version = models.PositiveIntegerField(null=True, blank=True)
    archive_file = models.CharField(max_length=200, blank=True)
    archive_line = models.PositiveIntegerField(null=True, blank=True)
    fate = models.JSONField(default=list, blank=True, decoder=RepairingJSONDecoder, help_text="the engine's fate events for this message")
    # While the message is live: the engine's own form of it (with its token
    # counts), written when it changes; the engine is rebuilt from these rows
    # and the session's small state header. None once it left the context.
    live_form = models.JSONField(null=True, blank=True, decoder=RepairingJSONDecoder)

    class Meta:
        ordering = ["seq"]
        constraints = [
            models.UniqueConstraint(fields=["session", "message_id"], name="sessionmessage_session_id_unique"),
            models.UniqueConstraint(fields=["session", "seq"], name="sessionmessage_session_seq_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.role} {self.message_id}"

    @property
    def is_live(self) -> bool:
        return self.status == self.Status.LIVE

    def fate_text(self) -> str:
        """What happened to the message, in one line ("" when nothing did); the status says where it is."""
        parts: list[str] = []
        if self.truncated_stage is not None:
            parts.append(f"truncated at stage {self.truncated_stage}"
                         + (f" before turn {self.truncated_turn}" if self.truncated_stage == 1 and self.truncated_turn
                            else f" in turn {self.truncated_turn}" if self.truncated_turn else ""))
        if self.compacted_turn is not None:
            parts.append(f"compacted in turn {self.compacted_turn}"
                         + (f" into summary v{self.summary_version}" if self.summary_version else ""))
        if self.archive_file:
            parts.append(f"{self.archive_file} line {self.archive_line}")
        return " · ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.message_id,
            "seq": self.seq,
            "role": self.role,
            "tokens": self.tokens,
            "status": self.status,
            "truncated_stage": self.truncated_stage,
            "truncated_turn": self.truncated_turn,
            "compacted_turn": self.compacted_turn,
            "summary_version": self.summary_version,
            "archive": {"file": self.archive_file, "line": self.archive_line} if self.archive_file else None,
        }

    def display_blocks(self, limit: int = 2_000) -> list[dict[str, str]]:
        """The current content as (kind, label, text) rows for the pages, each cut to ``limit`` characters."""
        rows: list[dict[str, str]] = []
        for block in self.current_content or []:
            kind = str(block.get("type", ""))
            label = kind
            if kind == "text":
                text = str(block.get("text", ""))
            elif kind == "thinking":
                text = str(block.get("thinking", ""))
            elif kind == "tool_use":
                label = f"tool call {block.get('name', '')}"
                text = block.get("raw_input") or json.dumps(block.get("input", {}), ensure_ascii=False)
            elif kind == "tool_result":
                label = f"tool result {block.get('name', '')}" + (" (error)" if block.get("is_error") else "")
                output = block.get("output", "")
                text = output if isinstance(output, str) else "\n".join(
                    str(p.get("text", "")) for p in output if isinstance(p, dict) and p.get("type") == "text")
            else:
                text = str(block.get("url") or "(inline data)")
            if len(text) > limit:
                text = text[:limit] + f"… ({len(text) - limit:,} more characters)"
            rows.append({"kind": kind, "label": label, "text": text})
        return rows


class SessionCall(models.Model):
    """One tool call a session ingested, and whether its result came: the engine's record
    of calls, kept as rows so that a commit writes the calls of its own step only.

    ``made`` is False for a call the engine no longer holds (its message was taken
    back) and for a result whose call it never held; ``input`` and ``raw_input`` are
    the arguments as ingested.
    """

    session = models.ForeignKey(AgentSession, models.CASCADE, related_name="calls")
    call_id = models.TextField()
    name = models.TextField(blank=True)
    input = models.JSONField(default=dict, blank=True, decoder=RepairingJSONDecoder)
    raw_input = models.TextField(null=True, blank=True)
    made = models.BooleanField(default=True)
    answered = models.BooleanField(default=False)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["session", "call_id"], name="sessioncall_session_call_unique")]

    def __str__(self) -> str:
        return f"{self.name} {self.call_id}"


class _PayloadAttribute:
    """``turn.payload``: always the whole payload, whatever form the row stores.

    The row holds either the payload itself or a delta against an earlier turn's
    (``payload_delta``); a delta is rebuilt on first read and kept on the
    instance. Assigning a list stores it whole; the services assign the stored
    form and the whole payload they have at hand with ``Turn.set_payload``.
    """

    def __init__(self, field: models.Field[Any, Any]) -> None:
        self.field = field

    def __get__(self, instance: Turn | None, cls: type | None = None) -> Any:
        if instance is None:
            return self
        name = self.field.attname
        if name not in instance.__dict__:
            instance.refresh_from_db(fields=[name])
        stored = instance.__dict__[name]
        if not payload_delta.is_delta(stored):
            return stored
        whole = instance.__dict__.get("_payload_whole")
        if whole is None or whole[0] is not stored:
            whole = (stored, instance.rebuild_payload(stored))
            instance.__dict__["_payload_whole"] = whole
        return whole[1]

    def __set__(self, instance: Turn, value: Any) -> None:
        instance.__dict__[self.field.attname] = value


class PayloadField(models.JSONField):
    """A JSON column read through ``_PayloadAttribute``, written in its stored form."""

    descriptor_class = _PayloadAttribute

    def pre_save(self, model_instance: models.Model, add: bool) -> Any:
        return model_instance.__dict__.get(self.attname)


class Turn(models.Model):
    """One run of the hook (or of a manual compaction) and its trace."""

    session = models.ForeignKey(AgentSession, models.CASCADE, related_name="turns")
    number = models.PositiveIntegerField()
    trigger = models.CharField(max_length=16)
    outcome = models.CharField(max_length=32)
    policy = models.CharField(max_length=16)
    trace = models.JSONField(decoder=RepairingJSONDecoder)
    # The exact messages sent to the LLM at this turn, in OpenAI's format.
    # Stored whole, or as a delta against an earlier turn's (``payload_delta``);
    # reading ``payload`` always gives the whole list.
    payload = PayloadField(default=list, decoder=RepairingJSONDecoder)
    used_tokens = models.PositiveIntegerField(
        default=0, help_text="system prompt + summary + messages as the hook measured them coming in")
    threshold = models.PositiveIntegerField(default=0)
    window = models.PositiveIntegerField(default=0)
    payload_tokens = models.PositiveIntegerField(default=0, help_text="exact tokens of the payload sent")
    compacted_count = models.PositiveIntegerField(default=0)
    duration_ms = models.FloatField(default=0.0)
    summary_version = models.PositiveIntegerField(default=0)
    # What the provider said the call cost, reported by the agent afterwards.
    usage = models.JSONField(null=True, blank=True)
    # The session's profile version this turn ran under (None: recorded before versions were).
    profile_version = models.PositiveIntegerField(null=True, blank=True)
    created = models.DateTimeField(default=now)

    class Meta:
        ordering = ["number"]
        constraints = [models.UniqueConstraint(fields=["session", "number"], name="turn_session_number_unique")]

    def __str__(self) -> str:
        return f"turn {self.number}: {self.outcome}"

    def set_payload(self, stored: Any, whole: list[dict[str, Any]]) -> None:
        """Store ``stored`` (a delta or the list) while reads see ``whole``, which the caller already has."""
        self.payload = stored
        if stored is not whole:
            self.__dict__["_payload_whole"] = (stored, whole)

    def rebuild_payload(self, stored: Any) -> list[dict[str, Any]]:
        keyframe = stored.get("keyframe")
        if not isinstance(keyframe, int) or isinstance(keyframe, bool):
            keyframe = 0
        rows = dict(Turn.objects.filter(session_id=self.session_id, number__gte=keyframe, number__lt=self.number)
                    .values_list("number", "payload"))
        try:
            return payload_delta.rebuild(self.number, stored, rows)
        except payload_delta.BrokenChain as exc:
            # An imported bundle that lost rows: the page shows no payload rather than failing.
            log.warning("session %s turn %s: payload cannot be rebuilt (%s)", self.session_id, self.number, exc)
            return []

    @property
    def is_failure(self) -> bool:
        return self.outcome in FAILURE_OUTCOMES

    @property
    def compacted(self) -> bool:
        return self.outcome in COMPACTION_OUTCOMES

    def layer_tokens(self) -> dict[str, int]:
        tokens = (self.trace.get("payload") or {}).get("tokens") or {}
        return {key: int(tokens.get(key, 0))
                for key in ("system", "summary", "tools", "messages", "tool_results", "total")}

    def steps(self) -> list[dict[str, Any]]:
        return list(self.trace.get("steps") or [])

    def payload_rows(self, limit: int = 300) -> list[dict[str, Any]]:
        """The payload's messages as (role, size, excerpt) rows for the turn page."""
        rows: list[dict[str, Any]] = []
        for index, message in enumerate(self.payload or []):
            content = message.get("content")
            text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
            if message.get("tool_calls"):
                text = (text if content else "") + json.dumps(message["tool_calls"], ensure_ascii=False)
            rows.append({"index": index, "role": message.get("role", ""), "name": message.get("name") or "",
                         "chars": len(text), "excerpt": text[:limit] + ("…" if len(text) > limit else "")})
        return rows

    def get_absolute_url(self) -> str:
        return reverse("cl-turn-detail", args=[self.session_id, self.number])

    def to_dict(self, *, full: bool = False) -> dict[str, Any]:
        data: dict[str, Any] = {
            "number": self.number,
            "trigger": self.trigger,
            "outcome": self.outcome,
            "policy": self.policy,
            "used_tokens": self.used_tokens,
            "threshold": self.threshold,
            "window": self.window,
            "payload_tokens": self.payload_tokens,
            "layers": self.layer_tokens(),
            "compacted": self.compacted_count,
            "summary_version": self.summary_version,
            "duration_ms": self.duration_ms,
            "usage": self.usage,
            "profile_version": self.profile_version,
            "created": self.created.isoformat(),
        }
        if full:
            data["trace"] = self.trace
            data["messages"] = self.payload
        return data


class SummaryVersion(models.Model):
    session = models.ForeignKey(AgentSession, models.CASCADE, related_name="summary_versions")
    version = models.PositiveIntegerField()
    text = models.TextField()
    turn = models.PositiveIntegerField()
    trigger = models.CharField(max_length=16, blank=True)
    compactor = models.CharField(max_length=32)
    fallback = models.BooleanField(default=False)
    compacted_ids = models.JSONField(default=list, blank=True)
    # Identifiers of the compacted messages this version kept neither in its
    # text nor in a file it names ({kind, value, message_id}); None: not checked yet.
    lost_at_compaction = models.JSONField(null=True, blank=True)
    lost_count = models.PositiveIntegerField(null=True, blank=True)
    # What the loss check searched and what it could not ({checked, checked_kinds,
    # unchecked: [{what, count, why}], references}); None: not checked by this check yet.
    loss_scope = models.JSONField(null=True, blank=True)
    created = models.DateTimeField(default=now)

    class Meta:
        ordering = ["version"]
        constraints = [
            models.UniqueConstraint(fields=["session", "version"], name="summaryversion_session_version_unique")
        ]

    def __str__(self) -> str:
        return f"summary v{self.version}"

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "text": self.text, "turn": self.turn, "trigger": self.trigger,
                "compactor": self.compactor, "fallback": self.fallback, "compacted_ids": self.compacted_ids,
                "created": self.created.isoformat(), "loss": self.loss()}

    def loss(self) -> dict[str, Any] | None:
        """The loss check's verdict on this version as data; None: not checked yet."""
        if self.loss_scope is None or self.lost_count is None:
            return None
        unchecked = list(self.loss_scope.get("unchecked") or [])
        return {"lost": list(self.lost_at_compaction or []), "lost_count": self.lost_count,
                "checked": int(self.loss_scope.get("checked") or 0),
                "checked_kinds": list(self.loss_scope.get("checked_kinds") or []), "unchecked": unchecked,
                "references": list(self.loss_scope.get("references") or []),
                "nothing_lost": self.lost_count == 0 and not unchecked}


class OffloadedFile(models.Model):
    """A full tool output saved under the workspace's ``tool_result/``."""

    session = models.ForeignKey(AgentSession, models.CASCADE, related_name="offloaded_files")
    path = models.CharField(max_length=300, help_text="relative to the session workspace")
    message_id = models.CharField(max_length=200, blank=True)
    tool = models.TextField(blank=True)
    stage = models.PositiveSmallIntegerField(default=1)
    bytes = models.PositiveBigIntegerField(default=0, help_text="size of the full output")
    kept_bytes = models.PositiveBigIntegerField(default=0, help_text="bytes left in the context")
    sha256 = models.CharField(max_length=64)
    expires_at = models.DateTimeField(null=True, blank=True)
    referenced = models.BooleanField(default=True, help_text="a live message still points to it")

    class Meta:
        ordering = ["path"]
        constraints = [models.UniqueConstraint(fields=["session", "path"], name="offloadedfile_session_path_unique")]

    def __str__(self) -> str:
        return self.path


class CompactionRun(models.Model):
    """A manual compaction: the row is the source of truth the pages read."""

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"
        # Stopped by a person: nothing of it was committed.
        CANCELLED = "cancelled"
        # A dry run's end states: its draft waits for review, then is accepted,
        # discarded, or found stale (the session moved so the draft no longer applies).
        DRAFT = "draft"
        ACCEPTED = "accepted"
        DISCARDED = "discarded"
        STALE = "stale"

    class Kind(models.TextChoices):
        COMPACTION = "compaction"
        DRY_RUN = "dry_run"

    session = models.ForeignKey(AgentSession, models.CASCADE, related_name="compaction_runs")
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.COMPACTION)
    # A dry run's draft: the planned summary (to commit without a second call),
    # what committing it would do, its lost identifiers, and the state it was made on.
    draft = models.JSONField(null=True, blank=True)
    state_version = models.PositiveIntegerField(null=True, blank=True)
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, models.SET_NULL, null=True, blank=True,
                                     related_name="+")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    trigger = models.CharField(max_length=16, default="manual")
    instruction = models.TextField(blank=True)
    error = models.TextField(blank=True)
    turn_number = models.PositiveIntegerField(null=True, blank=True)
    outcome = models.CharField(max_length=32, blank=True)
    created = models.DateTimeField(default=now)
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"compaction {self.pk} ({self.status})"

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.pk, "kind": self.kind, "status": self.status, "trigger": self.trigger,
                "instruction": self.instruction, "state_version": self.state_version,
                "error": self.error, "turn": self.turn_number, "outcome": self.outcome,
                "created": self.created.isoformat(),
                "started": self.started.isoformat() if self.started else None,
                "finished": self.finished.isoformat() if self.finished else None}

    def mark_running(self) -> None:
        self.status = self.Status.RUNNING
        self.started = now()
        self.save(update_fields=["status", "started"])

    def mark_done(self, *, turn_number: int, outcome: str) -> None:
        self.status = self.Status.DONE
        self.turn_number = turn_number
        self.outcome = outcome
        self.finished = now()
        self.save(update_fields=["status", "turn_number", "outcome", "finished"])

    def mark_failed(self, error: str) -> None:
        self.status = self.Status.FAILED
        # Part of it may be a provider's answer: one line, bounded.
        self.error = providers.bounded_upstream_text(error, limit=providers.MAX_RUN_ERROR_CHARS)
        self.finished = now()
        self.save(update_fields=["status", "error", "finished"])


class WhatIfRun(models.Model):
    """A replay of one session under a profile's edited, unsaved knobs: what would have happened.

    Nothing of the session changes: the replay runs on a fresh engine in a
    temporary workspace, and only this row keeps what it found (``result``).
    """

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    profile = models.ForeignKey(AgentProfile, models.CASCADE, related_name="what_ifs")
    session = models.ForeignKey(AgentSession, models.CASCADE, related_name="+")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, models.SET_NULL, null=True, blank=True,
                                     related_name="+")
    # The edited knobs as the form held them (``AgentProfile.recorded_values``).
    values = models.JSONField(default=dict)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    turns_total = models.PositiveIntegerField(default=0, help_text="turns this replay covers (capped)")
    turns_done = models.PositiveIntegerField(default=0)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    created = models.DateTimeField(default=now)
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"what-if {self.pk} ({self.status})"

    @property
    def finished_or_failed(self) -> bool:
        return self.status in (self.Status.DONE, self.Status.FAILED)

    @property
    def percent(self) -> int:
        return min(100, 100 * self.turns_done // self.turns_total) if self.turns_total else 0
