"""Pruning offloaded tool results whose retention has expired (unless a live message still names them)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.utils import timezone

from contextlab.sessions.models import (
    AgentSession,
    OffloadedFile,
)
from contextlab.sessions.services.inputs import SessionUnavailable
from contextlab.sessions.services.persistence import locked_session

log = logging.getLogger(__name__)


@dataclass
class PruneResult:
    sessions: int
    removed: list[str]  # "<session id>/<path>"
    kept_referenced: int  # expired files kept because the live context points to them


def offloaded_prune(*, now: datetime | None = None) -> PruneResult:
    """Delete offloaded tool outputs past their profile's retention, except those the
    live context still references; the rows stay (history) with ``referenced`` current.

    Only sessions with an unreferenced file old enough on disk are loaded, so
    the daily run costs little on a server with many sessions.
    """
    moment = now or timezone.now()
    candidates: set[Any] = set()
    for session_id, path, retention in (OffloadedFile.objects.filter(referenced=False)
                                        .values_list("session_id", "path", "session__profile__retention_days")):
        if session_id in candidates:
            continue
        file = Path(settings.WORKSPACES_DIR) / str(session_id) / path
        try:
            if file.stat().st_mtime + retention * 86_400 < moment.timestamp():
                candidates.add(session_id)
        except FileNotFoundError:
            pass  # pruned before
    result = PruneResult(sessions=0, removed=[], kept_referenced=0)
    for session in AgentSession.objects.filter(pk__in=candidates).select_related("profile"):
        try:
            with locked_session(session) as (locked, manager):
                removed = manager.cleanup_offloaded(now=moment)
                referenced = manager.referenced_files()
                rows = list(OffloadedFile.objects.filter(session=locked))
                for row in rows:
                    row.referenced = row.path in referenced
                OffloadedFile.objects.bulk_update(rows, ["referenced"])
                expired = moment.timestamp() - locked.profile.retention_days * 86_400
                kept = (locked.workspace_file(row.path) for row in rows if row.referenced)
                result.kept_referenced += sum(
                    1 for path in kept if path is not None and path.is_file() and path.stat().st_mtime < expired)
        except SessionUnavailable:
            continue  # being imported: the next run will see it
        result.sessions += 1
        result.removed.extend(f"{session.pk}/{path}" for path in removed)
        if removed:
            log.info("session %s: %d expired tool output(s) deleted", session.pk, len(removed))
    return result


