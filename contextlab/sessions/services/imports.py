"""Importing a recorded transcript (any format the engine reads) and replaying it through the hook, now or in the background."""

from __future__ import annotations

import contextlib
import functools
import logging
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, ParamSpec, TypeVar

from django.conf import settings
from django.contrib.auth.models import User
from django.core.files.uploadedfile import UploadedFile
from django.db import transaction
from django.utils import timezone

from contextlab.engine.core.errors import ContextLabError, MalformedInput
from contextlab.engine.core.messages import Message
from contextlab.engine.hook import TurnResult, replay_turns
from contextlab.engine.importers import load_transcript
from contextlab.engine.importers.release import release_memory
from contextlab.engine.observe.otlp import looks_like_otlp
from contextlab.sessions.models import (
    AgentProfile,
    AgentSession,
    CompactionRun,
)
from contextlab.sessions.services.bundles import session_import_bundle
from contextlab.sessions.services.inputs import MAX_TITLE_LENGTH, PayloadTooLarge, upload_budget
from contextlab.sessions.services.live_state import (
    current_live_view,
    live_state_of,
    run_announce,
    session_announce,
)
from contextlab.sessions.services.observed import (
    copaw_workspace_import,
    otlp_import,
    requests_import,
    zip_kind,
)
from contextlab.sessions.services.persistence import fate_sizes, load_manager, locked_session, persist_step
from contextlab.sessions.services.runs import (
    IMPORT_TRANSCRIPT,
    import_failed,
    import_reset,
    import_source_dir,
    run_claim,
    run_not_queued,
)
from contextlab.sessions.services.turns import session_create, session_delete
from contextlab.support import jobs

log = logging.getLogger(__name__)

_P = ParamSpec("_P")
_R = TypeVar("_R")


@dataclass
class _Spooled:
    path: Path
    name: str


@contextlib.contextmanager
def _spooled(upload: UploadedFile) -> Iterator[_Spooled]:
    """The upload as a file on disk (importers read paths), keeping its file name."""
    limit = settings.CONTEXTLAB_MAX_UPLOAD_BYTES
    if upload.size is not None and upload.size > limit:
        raise PayloadTooLarge(f"the file holds {upload.size:,} bytes, more than the {limit:,}-byte limit",
                              field="file")
    # Only the last part of the client's name, and only harmless characters.
    name = "".join(c if c.isalnum() or c in "._-" else "_" for c in PurePosixPath(upload.name or "").name)
    name = name.lstrip(".") or "transcript.json"
    with tempfile.TemporaryDirectory(prefix="contextlab-upload-") as tmp:
        path = Path(tmp) / name
        with path.open("wb") as fh:
            for chunk in upload.chunks():
                fh.write(chunk)
        yield _Spooled(path=path, name=name)


def _releasing(func: Callable[_P, _R]) -> Callable[_P, _R]:
    """``func``, after which the memory its import used goes back to the system, however it ended."""
    @functools.wraps(func)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return func(*args, **kwargs)
        finally:
            release_memory()
    return wrapper


@_releasing
def transcript_import(*, owner: User, path: str | Path | None = None, upload: UploadedFile | None = None,
                      profile: AgentProfile | None = None, title: str = "") -> AgentSession:
    """Import a recorded transcript (any format the engine reads, or a session bundle)
    and replay it through the hook turn by turn, persisting each turn.

    Unreadable input is refused before anything is written; a failure during the
    replay removes the half-imported session.
    """
    if (path is None) == (upload is None):
        raise MalformedInput("give a transcript path or an uploaded file", field="file")
    if upload is not None:
        with _spooled(upload) as spooled:
            return transcript_import(owner=owner, path=spooled.path, profile=profile,
                                     title=title or spooled.name[:MAX_TITLE_LENGTH])
    assert path is not None
    source = Path(path)
    restored = _import_without_replay(owner=owner, source=source, profile=profile, title=title)
    if restored is not None:
        return restored
    transcript = load_transcript(source, upload_budget(source.stat().st_size))
    session = session_create(owner=owner, system_prompt=transcript.system_prompt or "", profile=profile,
                             title=title or source.name[:MAX_TITLE_LENGTH])
    session.status = AgentSession.Status.IMPORTING
    session.source = {"format": transcript.format, "file": source.name, "warnings": transcript.warnings[:100],
                      "messages": len(transcript.messages)}
    session.save(update_fields=["status", "source"])
    try:
        _replay(session, transcript.messages, transcript.tools)
    except BaseException:
        session_delete(session=session)
        raise
    session.refresh_from_db()
    session.status = AgentSession.Status.ACTIVE
    session.save(update_fields=["status"])
    return session


def _import_without_replay(*, owner: User, source: Path, profile: AgentProfile | None,
                           title: str) -> AgentSession | None:
    """The session of a file that needs no replay (a zip: a CoPaw workspace, recorded requests or a
    session bundle; an OpenTelemetry trace), or None for a transcript to replay."""
    with source.open("rb") as fh:
        head = fh.read(4096)
    if head.startswith(b"PK\x03\x04"):
        return _zip_import(owner=owner, source=source, profile=profile, title=title)
    if looks_like_otlp(head):
        return otlp_import(owner=owner, path=source, title=title, file_name=source.name, profile=profile)
    return None


def _zip_import(*, owner: User, source: Path, profile: AgentProfile | None, title: str) -> AgentSession:
    """A zip is a CoPaw workspace, a folder of recorded requests or a session bundle; none needs a replay."""
    kind = zip_kind(source)
    if kind == "copaw_workspace":
        return copaw_workspace_import(owner=owner, path=source, title=title, file_name=source.name)
    if kind == "requests":
        return requests_import(owner=owner, path=source, title=title, file_name=source.name, profile=profile)
    return session_import_bundle(owner=owner, data=source, profile=profile)


def _replay(session: AgentSession, messages: list[Message], tools: list[dict[str, Any]] | None = None,
            progress: Callable[[int, int], None] | None = None) -> None:
    manager = load_manager(session)
    if tools:
        # The tool definitions the transcript's agent sent with every call are
        # a fixed layer of its budget, like the system prompt.
        manager.set_request_schemas(tools, None)
    originals = {m.id: m for m in messages}
    before: dict[str, int] = {}

    def on_turn(result: TurnResult, done: int) -> None:
        nonlocal before
        # One transaction per turn, like a live agent's hook calls; the
        # "importing" status keeps every other writer away meanwhile.
        with transaction.atomic():
            locked = AgentSession.objects.select_for_update(of=("self",)).get(pk=session.pk)
            persist_step(locked, manager, before=before, originals=originals, result=result)
        before = fate_sizes(manager)
        if progress is not None:
            progress(done, len(messages))

    if messages:
        replay_turns(messages, manager, on_turn=on_turn)



@_releasing
def transcript_import_enqueue(*, owner: User, path: str | Path | None = None, upload: UploadedFile | None = None,
                              profile: AgentProfile | None = None,
                              title: str = "") -> tuple[AgentSession, CompactionRun | None]:
    """Like ``transcript_import``, but the replay runs in the background.

    The transcript is read now, so unreadable input is refused before anything
    is written. A session bundle is restored at once (there is nothing to
    replay) and comes back without a run.
    """
    if (path is None) == (upload is None):
        raise MalformedInput("give a transcript path or an uploaded file", field="file")
    if upload is not None:
        with _spooled(upload) as spooled:
            return transcript_import_enqueue(owner=owner, path=spooled.path, profile=profile,
                                             title=title or spooled.name[:MAX_TITLE_LENGTH])
    assert path is not None
    source = Path(path)
    restored = _import_without_replay(owner=owner, source=source, profile=profile, title=title)
    if restored is not None:
        return restored, None
    transcript = load_transcript(source, upload_budget(source.stat().st_size))
    with transaction.atomic():
        session = session_create(owner=owner, system_prompt=transcript.system_prompt or "", profile=profile,
                                 title=title or source.name[:MAX_TITLE_LENGTH])
        session.status = AgentSession.Status.IMPORTING
        session.source = {"format": transcript.format, "file": source.name, "warnings": transcript.warnings[:100],
                          "messages": len(transcript.messages)}
        session.save(update_fields=["status", "source"])
        run = CompactionRun.objects.create(session=session, trigger="import", requested_by=owner)
        folder = import_source_dir(session.pk)
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, folder / source.name)
        transaction.on_commit(lambda: run_announce(run, done=0, total=len(transcript.messages)))
        jobs.enqueue(IMPORT_TRANSCRIPT, run.pk, on_error=lambda exc: run_not_queued(run, exc))
    return session, run



@_releasing
def transcript_import_work(*, run_id: int) -> str:
    """The background side of ``transcript_import_enqueue``: replay, publishing progress."""
    with jobs.hold_run(run_id) as held:
        if not held:
            return "busy"
        run, retried = run_claim(run_id)
        if run is None:
            return "skipped"
        session = run.session
        run_announce(run, retried=retried, done=0, total=int((session.source or {}).get("messages") or 0))
        try:
            files = sorted(p for p in import_source_dir(session.pk).glob("*") if p.is_file())
            if not files:
                raise MalformedInput("the uploaded transcript is gone; upload it again", field="file")
            # A retried run starts from scratch: the replay is deterministic.
            import_reset(session)
            transcript = load_transcript(files[0], upload_budget(files[0].stat().st_size))
            _replay(session, transcript.messages, transcript.tools,
                    progress=lambda done, total: run_announce(run, done=done, total=total))
            session.refresh_from_db()
            with transaction.atomic():
                session.status = AgentSession.Status.ACTIVE
                session.save(update_fields=["status"])
                run.status = CompactionRun.Status.DONE
                run.turn_number = session.turns_count
                run.outcome = "imported"
                run.finished = timezone.now()
                run.save(update_fields=["status", "turn_number", "outcome", "finished"])
            shutil.rmtree(import_source_dir(session.pk), ignore_errors=True)
        except ContextLabError as exc:
            import_failed(run, exc.message)
        except Exception as exc:
            log.exception("import run %s failed", run_id)
            import_failed(run, f"{type(exc).__name__}: {exc}")
        session.refresh_from_db()
        # Loaded under the lock: the session is open to writers again (see ``load_manager``).
        with locked_session(session) as (locked, manager):
            state = live_state_of(locked, manager, None, current_live_view(locked))
        session_announce(session_id=session.pk, state=state)
        run_announce(run, done=session.messages_count, total=int((session.source or {}).get("messages") or 0))
        return str(run.status)


