"""Session bundles: one zip with a session's rows, engine state and workspace files, exported and imported."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import shutil
import uuid
import zipfile
from collections.abc import Mapping
from datetime import datetime
from pathlib import PurePosixPath
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import DatabaseError, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from contextlab.engine.archive import DialogArchive
from contextlab.engine.errors import MalformedInput
from contextlab.sessions.models import (
    PROFILE_KNOBS,
    AgentProfile,
    AgentSession,
    CompactionRun,
    OffloadedFile,
    SessionMessage,
    SummaryVersion,
    Turn,
)
from contextlab.sessions.services.inputs import BUNDLE_FORMAT, PayloadTooLarge
from contextlab.sessions.services.persistence import load_manager
from contextlab.sessions.services.profiles import profile_create

log = logging.getLogger(__name__)

_BUNDLE_SESSION_FIELDS = ("title", "system_prompt", "status", "summary", "summary_version", "tokens_used",
                          "tokens_threshold", "tokens_window", "turns_count", "compactions_count",
                          "failures_count", "messages_count", "live_count", "source")
_BUNDLE_ROWS: dict[str, tuple[type[Any], tuple[str, ...]]] = {
    "messages.jsonl": (SessionMessage, ("message_id", "seq", "role", "name", "timestamp", "content",
                                        "current_content", "tokens", "status", "truncated_stage", "truncated_turn",
                                        "compacted_turn", "summary_version", "archive_file", "archive_line",
                                        "fate", "live_form")),
    "turns.jsonl": (Turn, ("number", "trigger", "outcome", "policy", "trace", "payload", "used_tokens", "threshold",
                           "window", "payload_tokens", "compacted_count", "duration_ms", "summary_version", "usage",
                           "created")),
    "summaries.jsonl": (SummaryVersion, ("version", "text", "turn", "trigger", "compactor", "fallback",
                                         "compacted_ids", "created")),
    "offloaded_files.jsonl": (OffloadedFile, ("path", "message_id", "tool", "stage", "bytes", "kept_bytes", "sha256",
                                              "expires_at", "referenced")),
    "compaction_runs.jsonl": (CompactionRun, ("status", "trigger", "instruction", "error", "turn_number", "outcome",
                                              "created", "started", "finished")),
}
_DATETIME_FIELDS = {"created", "started", "finished", "expires_at", "last_activity"}
# A fixed timestamp inside the zip, so the same session always gives the same bytes.
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


def _json_value(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def _zip_write(archive: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    archive.writestr(info, data)


def session_export(*, session: AgentSession) -> bytes:
    """The whole session as a zip: rows, engine state and the workspace files."""
    manifest = {
        "format": BUNDLE_FORMAT,
        "id": str(session.id),
        "created": session.created.isoformat(),
        "last_activity": session.last_activity.isoformat(),
        "session": {name: getattr(session, name) for name in _BUNDLE_SESSION_FIELDS},
        "profile": {"name": session.profile.name, **session.profile.knobs()},
        "engine_state": session.engine_state,
    }
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        _zip_write(archive, "session.json", json.dumps(manifest, ensure_ascii=False, indent=1).encode())
        for file_name, (model, fields) in _BUNDLE_ROWS.items():
            rows = model.objects.filter(session=session).order_by("pk").values_list(*fields)
            lines = [json.dumps(dict(zip(fields, map(_json_value, row), strict=True)), ensure_ascii=False)
                     for row in rows]
            _zip_write(archive, file_name, "".join(line + "\n" for line in lines).encode())
        workspace = session.workspace
        # The archive journal is bookkeeping of a turn in flight here (see
        # ``load_manager``), not session data: a bundle carries the committed state.
        journal = workspace / DialogArchive.folder_name / DialogArchive.journal_name
        if workspace.is_dir():
            for path in sorted(p for p in workspace.rglob("*") if p.is_file() and p != journal):
                _zip_write(archive, f"workspace/{path.relative_to(workspace).as_posix()}", path.read_bytes())
    return buffer.getvalue()


def _bundle_member_path(name: str) -> str | None:
    """The workspace-relative path of a ``workspace/…`` member; refuses anything that could escape."""
    if not name.startswith("workspace/") or name.endswith("/"):
        return None
    relative = PurePosixPath(name[len("workspace/"):])
    if relative.is_absolute() or not relative.parts or any(p in ("..", "") or "\\" in p for p in relative.parts):
        raise MalformedInput(f"the bundle holds an unsafe path {name!r}", field="file")
    return relative.as_posix()


def _bundle_profile(owner: User, data: Mapping[str, Any]) -> AgentProfile:
    """The owner's profile with the bundle's name and knobs, created when there is none."""
    name = str(data.get("name") or "imported")
    knobs = {k: data[k] for k in PROFILE_KNOBS if k in data}
    same = AgentProfile.objects.filter(owner=owner, name=name).first()
    if same is not None and same.knobs() == {**same.knobs(), **knobs}:
        return same
    candidate, n = name if same is None else f"{name} (imported)", 1
    while AgentProfile.objects.filter(owner=owner, name=candidate).exists():
        n += 1
        candidate = f"{name} (imported {n})"
    return profile_create(owner=owner, name=candidate, knobs=knobs)


def session_import_bundle(*, owner: User, data: bytes, profile: AgentProfile | None = None) -> AgentSession:
    """Recreate a session from ``session_export``'s zip, for ``owner``.

    The session keeps its id when that id is free (so the notices in its
    messages still name its own workspace), else it gets a new one.
    """
    limit = settings.CONTEXTLAB_MAX_UPLOAD_BYTES
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        infos = archive.infolist()
    except zipfile.BadZipFile as exc:
        raise MalformedInput(f"not a session bundle: {exc}", field="file") from exc
    # Declared sizes bound what reading can cost (a zip bomb is refused here).
    if sum(info.file_size for info in infos) > 4 * limit:
        raise PayloadTooLarge("the bundle unpacks to more than the upload limit allows", field="file")
    names = {info.filename for info in infos}
    if "session.json" not in names:
        raise MalformedInput("not a session bundle: session.json is missing", field="file")
    files = {rel: info for info in infos if (rel := _bundle_member_path(info.filename)) is not None}
    try:
        manifest = json.loads(archive.read("session.json"))
        rows = {name: [json.loads(line) for line in archive.read(name).splitlines() if line.strip()]
                for name in _BUNDLE_ROWS if name in names}
    except (ValueError, RecursionError) as exc:
        raise MalformedInput(f"the bundle holds invalid JSON: {exc}", field="file") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != BUNDLE_FORMAT:
        raise MalformedInput(f"not a session bundle of format {BUNDLE_FORMAT}", field="file")

    try:
        session = _bundle_restore(owner, profile, manifest, rows, archive, files)
    except (TypeError, ValueError, KeyError, DatabaseError) as exc:
        raise MalformedInput(f"the bundle does not describe a valid session: {exc}", field="file") from exc
    return session


def _bundle_restore(owner: User, profile: AgentProfile | None, manifest: dict[str, Any],
                    rows: dict[str, list[dict[str, Any]]], archive: zipfile.ZipFile,
                    files: dict[str, zipfile.ZipInfo]) -> AgentSession:
    with transaction.atomic():
        profile = profile or _bundle_profile(owner, manifest.get("profile") or {})
        session = AgentSession(owner=owner, profile=profile, engine_state=manifest.get("engine_state") or {},
                               created=parse_datetime(manifest.get("created") or "") or timezone.now(),
                               last_activity=parse_datetime(manifest.get("last_activity") or "") or timezone.now())
        wanted = manifest.get("id")
        with contextlib.suppress(ValueError, ValidationError):
            if wanted and not AgentSession.objects.filter(pk=wanted).exists():
                session.id = uuid.UUID(str(wanted))
        for name in _BUNDLE_SESSION_FIELDS:
            if name in (manifest.get("session") or {}):
                setattr(session, name, manifest["session"][name])
        try:
            session.full_clean(exclude=["owner", "profile", "engine_state", "source"])
        except ValidationError as exc:
            field, messages = next(iter(exc.message_dict.items()))
            raise MalformedInput(f"session.{field}: {' '.join(messages)}", field="file") from exc
        session.save(force_insert=True)
        for name, (model, fields) in _BUNDLE_ROWS.items():
            objects = []
            for record in rows.get(name, []):
                values = {k: record.get(k) for k in fields if k in record}
                for key in _DATETIME_FIELDS & values.keys():
                    values[key] = parse_datetime(str(values[key])) if values[key] else None
                objects.append(model(session=session, **values))
            model.objects.bulk_create(objects)
        workspace = session.workspace
        # A folder left by a session deleted outside the services is stale.
        shutil.rmtree(workspace, ignore_errors=True)
        try:
            for relative, info in sorted(files.items()):
                target = workspace / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(archive.read(info))
            # Loading the engine from the restored state proves the bundle is usable.
            load_manager(session)
        except BaseException:
            shutil.rmtree(workspace, ignore_errors=True)
            raise
    return session


