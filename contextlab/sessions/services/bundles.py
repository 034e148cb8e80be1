"""Session bundles: one zip with a session's rows, engine state and workspace files, exported and imported."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import re
import shutil
import uuid
import zipfile
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import DatabaseError, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from contextlab import providers
from contextlab.engine.archive import DialogArchive
from contextlab.engine.errors import MalformedInput
from contextlab.engine.memory import BACKUP_DIR, DAILY_DIR
from contextlab.engine.paths import UnsafePath, relative_parts
from contextlab.engine.retrieval import EXTERNALIZED_DIR
from contextlab.engine.truncation import OffloadStore
from contextlab.sessions import loss_records
from contextlab.sessions.models import (
    PROFILE_KNOBS,
    AgentProfile,
    AgentSession,
    CompactionRun,
    OffloadedFile,
    SessionCall,
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
    # The engine's record of tool calls (the state header no longer lists them).
    "calls.jsonl": (SessionCall, ("call_id", "name", "input", "raw_input", "made", "answered")),
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
        loss_records.record(session)
        # The loss check's verdict travels with each version for a reader of the export; an
        # import does not take it (a bundle's word is no check) and checks the versions again.
        losses = {v.version: v.loss() for v in SummaryVersion.objects.filter(session=session)}
        for file_name, (model, fields) in _BUNDLE_ROWS.items():
            rows = model.objects.filter(session=session).order_by("pk").values_list(*fields)
            lines = [json.dumps({**dict(zip(fields, map(_json_value, row), strict=True)),
                                 **({"loss": losses.get(row[0])} if model is SummaryVersion else {})},
                                ensure_ascii=False)
                     for row in rows]
            _zip_write(archive, file_name, "".join(line + "\n" for line in lines).encode())
        workspace = session.workspace
        # Only what an import keeps: the archive journal, for one, is bookkeeping
        # of a turn in flight here (see ``load_manager``), not session data.
        if workspace.is_dir():
            for path in sorted(workspace.rglob("*")):
                relative = PurePosixPath(path.relative_to(workspace).as_posix())
                if path.is_file() and not path.is_symlink() and _bundle_keeps(relative):
                    _zip_write(archive, f"workspace/{relative}", path.read_bytes())
    return buffer.getvalue()


# What a bundle's ``workspace/`` may hold: the folders the engine and the
# insights write ("compare" is the policy comparison's result) and the two kinds
# of top-level file. Anything else, hidden members included (the archive's
# journal of a turn in flight above all), is no session data and is dropped.
_BUNDLE_FOLDERS = frozenset({DialogArchive.folder_name, OffloadStore.folder_name, EXTERNALIZED_DIR, DAILY_DIR,
                             BACKUP_DIR, "compare"})
_BUNDLE_TOP_FILES = re.compile(r"^(?:MEMORY\.md|compact_invalid_[0-9a-f]+\.json)$")
# Members are read in pieces of this size, counting what decompression really produces.
_READ_CHUNK = 1024 * 1024


def _bundle_keeps(relative: PurePosixPath) -> bool:
    """True when a workspace-relative path is one a session bundle may carry."""
    if any(part.startswith(".") for part in relative.parts):
        return False
    if len(relative.parts) == 1:
        return bool(_BUNDLE_TOP_FILES.match(relative.name))
    return relative.parts[0] in _BUNDLE_FOLDERS


def _bundle_member_path(name: str) -> str | None:
    """The workspace-relative path of a ``workspace/…`` member a bundle may carry, else None.

    A member that could escape the workspace makes the whole bundle suspect: it is refused.
    """
    if not name.startswith("workspace/") or name.endswith("/"):
        return None
    relative = relative_parts(name[len("workspace/"):], field="file")
    if not _bundle_keeps(relative):
        log.info("session bundle: member %r dropped, not session data", name)
        return None
    return relative.as_posix()


def _check_row_paths(rows: dict[str, list[dict[str, Any]]]) -> None:
    """Paths in the rows name workspace files; each must be one a bundle may carry."""
    checks = (("offloaded_files.jsonl", "path"), ("messages.jsonl", "archive_file"))
    for file_name, key in checks:
        for index, record in enumerate(rows.get(file_name, [])):
            value = record.get(key) if isinstance(record, dict) else None
            if key == "archive_file" and not value:
                continue
            try:
                kept = isinstance(value, str) and _bundle_keeps(relative_parts(value))
            except UnsafePath:
                kept = False
            if not kept:
                raise MalformedInput(f"{file_name}[{index}].{key} names {value!r}, not a file of the session's "
                                     "workspace", field="file")


def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, budget: list[int]) -> bytes:
    """A member's bytes, counted against ``budget`` as they come out of decompression.

    The sizes a zip declares are the sender's word; only the running total of
    what is actually produced bounds the memory a bundle can cost.
    """
    parts: list[bytes] = []
    with archive.open(info) as member:
        while chunk := member.read(_READ_CHUNK):
            _spend(budget, len(chunk))
            parts.append(chunk)
    return b"".join(parts)


def _read_rows(archive: zipfile.ZipFile, info: zipfile.ZipInfo, budget: list[int]) -> list[Any]:
    """The JSON lines of a member, read line by line: only the parsed rows are held."""
    rows: list[Any] = []
    longest = _longest_json()
    with archive.open(info) as member:
        while line := member.readline(longest + 1):
            _spend(budget, len(line))
            if len(line) > longest:
                raise PayloadTooLarge(f"{info.filename} holds a line longer than {longest:,} bytes", field="file")
            if line.strip():
                rows.append(json.loads(line))
    return rows


def _longest_json() -> int:
    """The most bytes one JSON document of a bundle (session.json, a row) may hold: twice an API body."""
    return 2 * int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)


def _copy_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, target: Path, budget: list[int]) -> None:
    """A workspace member written to ``target`` piece by piece, never whole in memory."""
    with archive.open(info) as member, target.open("wb") as out:
        while chunk := member.read(_READ_CHUNK):
            _spend(budget, len(chunk))
            out.write(chunk)


def _spend(budget: list[int], size: int) -> None:
    budget[0] -= size
    if budget[0] < 0:
        raise PayloadTooLarge("the bundle unpacks to more than the upload limit allows", field="file")


def _bundle_profile(owner: User, data: Mapping[str, Any]) -> AgentProfile:
    """The owner's profile with the bundle's name and knobs, created when there is none."""
    name = str(data.get("name") or "imported")
    # A bundle cannot choose where this server sends requests: the URL and key
    # variable of older bundles are dropped, and a provider this server does not
    # offer leaves the imported profile with the offline compactor.
    knobs = {k: data[k] for k in PROFILE_KNOBS if k in data}
    if knobs.get("compactor") == "openai" and knobs.get("compaction_provider") not in providers.configured():
        knobs.update(compactor="extractive", compaction_provider="")
    same = AgentProfile.objects.filter(owner=owner, name=name).first()
    if same is not None and same.knobs() == {**same.knobs(), **knobs}:
        return same
    candidate, n = name if same is None else f"{name} (imported)", 1
    while AgentProfile.objects.filter(owner=owner, name=candidate).exists():
        n += 1
        candidate = f"{name} (imported {n})"
    return profile_create(owner=owner, name=candidate, knobs=knobs)


def session_import_bundle(*, owner: User, data: bytes | Path, profile: AgentProfile | None = None) -> AgentSession:
    """Recreate a session from ``session_export``'s zip (its bytes or its file), for ``owner``.

    The session keeps its id when that id is free (so the notices in its
    messages still name its own workspace), else it gets a new one.
    """
    limit = settings.CONTEXTLAB_MAX_UPLOAD_BYTES
    try:
        archive = zipfile.ZipFile(io.BytesIO(data) if isinstance(data, bytes) else data)
        infos = archive.infolist()
    except zipfile.BadZipFile as exc:
        raise MalformedInput(f"not a session bundle: {exc}", field="file") from exc
    # Declared sizes refuse an honest oversized bundle at once; ``_read_member``
    # holds a lying one to the same total.
    if sum(info.file_size for info in infos) > 4 * limit:
        raise PayloadTooLarge("the bundle unpacks to more than the upload limit allows", field="file")
    budget = [4 * limit]
    names = {info.filename for info in infos}
    if "session.json" not in names:
        raise MalformedInput("not a session bundle: session.json is missing", field="file")
    files = {rel: info for info in infos if (rel := _bundle_member_path(info.filename)) is not None}
    try:
        manifest_info = archive.getinfo("session.json")
        if manifest_info.file_size > _longest_json():
            raise PayloadTooLarge(f"session.json is larger than {_longest_json():,} bytes", field="file")
        manifest = json.loads(_read_member(archive, manifest_info, budget))
        rows = {name: _read_rows(archive, archive.getinfo(name), budget) for name in _BUNDLE_ROWS if name in names}
    except (ValueError, RecursionError, zipfile.BadZipFile) as exc:
        raise MalformedInput(f"the bundle holds invalid JSON: {exc}", field="file") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != BUNDLE_FORMAT:
        raise MalformedInput(f"not a session bundle of format {BUNDLE_FORMAT}", field="file")
    for key in ("engine_state", "profile", "session"):
        if manifest.get(key) is not None and not isinstance(manifest[key], dict):
            raise MalformedInput(f"session.json: {key} must be an object", field="file")
    for name, records in rows.items():
        if not all(isinstance(record, dict) for record in records):
            raise MalformedInput(f"{name}: every line must be an object", field="file")
    _check_row_paths(rows)

    try:
        session = _bundle_restore(owner, profile, manifest, rows, archive, files, budget)
    except (TypeError, ValueError, KeyError, DatabaseError, zipfile.BadZipFile) as exc:
        raise MalformedInput(f"the bundle does not describe a valid session: {exc}", field="file") from exc
    return session


def _bundle_restore(owner: User, profile: AgentProfile | None, manifest: dict[str, Any],
                    rows: dict[str, list[dict[str, Any]]], archive: zipfile.ZipFile,
                    files: dict[str, zipfile.ZipInfo], budget: list[int]) -> AgentSession:
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
        # A new turn is written without a lookup when its number is past turns_count
        # (persistence._persist_turn): a bundle whose count lags its turn rows must not
        # make the next turn collide with one of them.
        numbers = [r["number"] for r in rows.get("turns.jsonl", []) if type(r.get("number")) is int]
        if numbers and isinstance(session.turns_count, int) and max(numbers) > session.turns_count:
            session.turns_count = max(numbers)
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
                _copy_member(archive, info, target, budget)
            # Loading the engine from the restored state proves the bundle is usable.
            load_manager(session)
        except BaseException:
            shutil.rmtree(workspace, ignore_errors=True)
            raise
    return session


