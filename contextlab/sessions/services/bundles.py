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
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import DatabaseError, transaction
from django.db.models import Max
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from contextlab.engine.core.errors import MalformedInput
from contextlab.engine.core.paths import UnsafePath, relative_parts
from contextlab.engine.importers.json_stream import JsonSyntaxError, ParseBudget, bounded_lines, load_line
from contextlab.engine.memory.long_term import BACKUP_DIR, DAILY_DIR
from contextlab.engine.memory.retrieval import EXTERNALIZED_DIR
from contextlab.engine.stages.archive import DialogArchive
from contextlab.engine.stages.truncation import OffloadStore
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
from contextlab.sessions.services.inputs import BUNDLE_FORMAT, PayloadTooLarge, upload_budget
from contextlab.sessions.services.persistence import load_manager
from contextlab.sessions.services.profiles import profile_create
from contextlab.support import providers

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


def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, budget: list[int]) -> bytes:
    """A JSON member's bytes (session.json), counted against ``budget`` as they come out of
    decompression and refused past the limit of one JSON document, whatever its header claims."""
    parts: list[bytes] = []
    read = 0
    with archive.open(info) as member:
        while chunk := member.read(_READ_CHUNK):
            _spend(budget, len(chunk))
            read += len(chunk)
            if read > _longest_json():
                raise PayloadTooLarge(f"{info.filename} is larger than the {_longest_json():,}-byte limit for one "
                                      "JSON document of a bundle (CONTEXTLAB_MAX_BODY_BYTES × 2)", field="file")
            parts.append(chunk)
    return b"".join(parts)


def _iter_rows(archive: zipfile.ZipFile, info: zipfile.ZipInfo, budget: list[int],
               parse: ParseBudget) -> Iterator[tuple[int, int, Any, int]]:
    """The JSON lines of a member as (1-based line, bytes, value, what the value costs of ``parse``),
    one at a time: only the current line is held, and a line past the limit of one is refused as soon
    as its first piece over it is read (``bounded_lines``)."""
    with archive.open(info) as member:
        for number, offset, line in bounded_lines(member, parse, info.filename):
            _spend(budget, len(line))
            if line.strip():
                spent, held = parse.spent, parse.held
                try:
                    value = load_line(line, where=f"in {info.filename} line {number}", budget=parse, offset=offset)
                except JsonSyntaxError as exc:
                    raise MalformedInput(f"{info.filename} line {number} is not valid JSON: {exc}",
                                         field="file") from exc
                size = len(line)
                del line
                # What the row holds, not the keys kept for the whole bundle: given back once it is inserted.
                yield number, size, value, (parse.spent - spent) - (parse.held - held)


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
        total = _unpacked_limit()
        raise PayloadTooLarge(f"the bundle unpacks to more than {total:,} bytes (the upload limit, "
                              "CONTEXTLAB_MAX_UPLOAD_BYTES)", field="file")


def _unpacked_limit() -> int:
    """The most a bundle may unpack to: what an upload may be (a zip stored without compression)."""
    return int(settings.CONTEXTLAB_MAX_UPLOAD_BYTES)


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
    messages still name its own workspace), else it gets a new one. What it
    parses counts against the upload's ``ParseBudget``, each batch of rows given
    back once inserted.
    """
    # Rows are let go batch by batch: their strings are not kept for the whole bundle.
    parse = upload_budget(len(data) if isinstance(data, bytes) else data.stat().st_size, share_strings=False)
    try:
        archive = zipfile.ZipFile(io.BytesIO(data) if isinstance(data, bytes) else data)
        infos = archive.infolist()
    except zipfile.BadZipFile as exc:
        raise MalformedInput(f"not a session bundle: {exc}", field="file") from exc
    # Declared sizes refuse an honest oversized bundle at once; ``_spend``
    # holds a lying one to the same total as decompression really produces it.
    if sum(info.file_size for info in infos) > _unpacked_limit():
        _spend([0], 1)
    budget = [_unpacked_limit()]
    names = {info.filename for info in infos}
    if "session.json" not in names:
        raise MalformedInput("not a session bundle: session.json is missing", field="file")
    files = {rel: info for info in infos if (rel := _bundle_member_path(info.filename)) is not None}
    try:
        manifest_info = archive.getinfo("session.json")
        if manifest_info.file_size > _longest_json():
            raise PayloadTooLarge(f"session.json is larger than the {_longest_json():,}-byte limit for one JSON "
                                  "document of a bundle (CONTEXTLAB_MAX_BODY_BYTES × 2)", field="file")
        manifest = load_line(_read_member(archive, manifest_info, budget), where="in session.json", budget=parse)
    except (JsonSyntaxError, zipfile.BadZipFile) as exc:
        raise MalformedInput(f"the bundle holds invalid JSON: {exc}", field="file") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != BUNDLE_FORMAT:
        raise MalformedInput(f"not a session bundle of format {BUNDLE_FORMAT}", field="file")
    for key in ("engine_state", "profile", "session"):
        if manifest.get(key) is not None and not isinstance(manifest[key], dict):
            raise MalformedInput(f"session.json: {key} must be an object", field="file")
    row_infos = {name: archive.getinfo(name) for name in _BUNDLE_ROWS if name in names}
    try:
        session = _bundle_restore(owner, profile, manifest, row_infos, archive, files, budget, parse)
    except zipfile.BadZipFile as exc:
        raise MalformedInput(f"not a session bundle: {exc}", field="file") from exc
    except (TypeError, ValueError, KeyError, DatabaseError) as exc:
        # The text of a database error names a table and a constraint, nothing
        # the sender can act on: the rows were checked field by field before.
        log.info("session bundle refused: %s", exc)
        raise MalformedInput(f"the bundle does not describe a valid session ({type(exc).__name__})",
                             field="file") from exc
    return session


# Rows are inserted in batches of about this many bytes of JSON (or this many rows).
_BATCH_BYTES = 2 * 1024 * 1024
_BATCH_ROWS = 500


def _bundle_restore(owner: User, profile: AgentProfile | None, manifest: dict[str, Any],
                    row_infos: dict[str, zipfile.ZipInfo], archive: zipfile.ZipFile,
                    files: dict[str, zipfile.ZipInfo], budget: list[int], parse: ParseBudget) -> AgentSession:
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
        # Rows are checked and inserted as they are read, a batch at a time: a
        # bundle costs the memory of one batch, not of all its rows.
        for name, info in row_infos.items():
            _insert_rows(session, name, _iter_rows(archive, info, budget, parse), parse)
        # A new turn is written without a lookup when its number is past turns_count
        # (persistence._persist_turn): a bundle whose count lags its turn rows must not
        # make the next turn collide with one of them.
        highest = session.turns.aggregate(highest=Max("number"))["highest"]
        if highest is not None and isinstance(session.turns_count, int) and highest > session.turns_count:
            session.turns_count = highest
            session.save(update_fields=["turns_count"])
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


def _insert_rows(session: AgentSession, name: str, rows: Iterable[tuple[int, int, Any, int]],
                 parse: ParseBudget) -> None:
    """Rows checked and inserted a batch at a time; what a batch cost of ``parse`` is given back once inserted."""
    model, fields = _BUNDLE_ROWS[name]
    required = _required_fields(model, fields)
    batch: list[Any] = []
    batch_bytes = 0
    batch_cost = 0
    # The live messages are what the engine loads whenever the session is
    # opened: a bundle may not make that larger than one JSON document may be.
    live_budget = _longest_json()
    for number, size, record, cost in rows:
        where = f"{name} line {number}"
        batch_cost += cost
        if not isinstance(record, dict):
            raise MalformedInput(f"{where}: every line must be an object", field="file")
        _check_row_path(name, where, record)
        if model is SessionMessage and record.get("status", SessionMessage.Status.LIVE) == SessionMessage.Status.LIVE:
            live_budget -= size
            if live_budget < 0:
                raise PayloadTooLarge(f"{where}: the live messages of the bundle hold more than the "
                                      f"{_longest_json():,}-byte limit of a session's live context "
                                      "(CONTEXTLAB_MAX_BODY_BYTES × 2)", field="file")
        values = {k: record[k] for k in fields if k in record}
        for key, needed in required.items():
            if values.get(key, needed) is None:
                raise MalformedInput(f"{where}: {key} is required", field="file")
        for key in _DATETIME_FIELDS & values.keys():
            values[key] = parse_datetime(str(values[key])) if values[key] else None
        batch.append(model(session=session, **values))
        # The row's size as JSON is what it costs in memory, to within a small factor.
        batch_bytes += size
        del record
        if len(batch) >= _BATCH_ROWS or batch_bytes >= _BATCH_BYTES:
            model.objects.bulk_create(batch)
            parse.release(batch_cost)
            batch, batch_bytes, batch_cost = [], 0, 0
    if batch:
        model.objects.bulk_create(batch)
        parse.release(batch_cost)


def _required_fields(model: type[Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """The row fields the database cannot store as null, each with what a missing one becomes.

    A missing field takes the model's default (a text field's is the empty
    string); None means it has none, so the row must carry a value.
    """
    out: dict[str, Any] = {}
    for name in fields:
        field = model._meta.get_field(name)
        if not field.null and not getattr(field, "auto_now_add", False):
            out[name] = field.get_default() if field.has_default() or field.empty_strings_allowed else None
    return out


def _check_row_path(file_name: str, where: str, record: dict[str, Any]) -> None:
    """Paths in the rows name workspace files; each must be one a bundle may carry."""
    key = {"offloaded_files.jsonl": "path", "messages.jsonl": "archive_file"}.get(file_name)
    if key is None:
        return
    value = record.get(key)
    if key == "archive_file" and not value:
        return
    try:
        kept = isinstance(value, str) and _bundle_keeps(relative_parts(value))
    except UnsafePath:
        kept = False
    if not kept:
        raise MalformedInput(f"{where}: {key} names {value!r}, not a file of the session's workspace",
                             field="file")
