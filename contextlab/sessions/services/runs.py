"""The life of a background run (a manual compaction or an import), and the sweep for runs whose worker died.

A run row (CompactionRun; trigger "import" for a background import) goes
queued -> running -> done | failed. A worker takes ``jobs.hold_run`` before it
marks the run running and keeps it to the end, so a running run nobody holds
belonged to a worker that died: ``runs_reap`` fails it. A compaction commits
in one transaction with its run's final status, so a dead worker leaves the
session exactly as it was (the engine writes the archive before it removes
anything, and the database rolls back whatever the transaction had written).
"""

from __future__ import annotations

import logging
import shutil
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from contextlab.engine.hook import ContextManager
from contextlab.sessions.models import (
    AgentSession,
    CompactionRun,
    OffloadedFile,
    SessionCall,
    SessionMessage,
    SummaryVersion,
    Turn,
)
from contextlab.sessions.services.live_state import run_announce
from contextlab.support import jobs

log = logging.getLogger(__name__)

# The tasks that execute runs, by their registered names: the task modules
# import these workflows, so the workflows name them instead of importing them.
COMPACT_SESSION = "contextlab.sessions.tasks.compact_session"
IMPORT_TRANSCRIPT = "contextlab.sessions.tasks.import_transcript"

WORKER_DIED = ("the worker running this job stopped before it finished; nothing it had started was kept. "
               "Run it again.")
NEVER_STARTED = ("no worker took this job within {minutes} minutes (is a `celery worker` running?); "
                 "it was not started. Run it again.")


def run_claim(run_id: int) -> tuple[CompactionRun | None, bool]:
    """Mark the run running; (None, False) when it is gone or already finished.

    A run found running was started by a worker that died (the caller holds
    the run, so nobody else is working on it): it is taken over, i.e. retried.
    """
    with transaction.atomic():
        run = (CompactionRun.objects.select_for_update(of=("self",)).select_related("session")
               .filter(pk=run_id).first())
        if run is None or run.status not in (CompactionRun.Status.QUEUED, CompactionRun.Status.RUNNING):
            return None, False
        retried = run.status == CompactionRun.Status.RUNNING
        run.status = CompactionRun.Status.RUNNING
        run.started = timezone.now()
        run.finished = None
        run.error = ""
        run.save(update_fields=["status", "started", "finished", "error"])
    return run, retried



def import_source_dir(session_id: Any) -> Path:
    # Beside the workspaces (web and worker processes share that folder), not
    # inside the session's own CoPaw-layout workspace.
    return Path(settings.WORKSPACES_DIR) / ".imports" / str(session_id)

def import_reset(session: AgentSession) -> None:
    """Forget every turn an interrupted or failed replay wrote; the session row stays."""
    with transaction.atomic():
        for model in (SessionMessage, SessionCall, Turn, SummaryVersion, OffloadedFile):
            model.objects.filter(session=session).delete()
        shutil.rmtree(session.workspace, ignore_errors=True)
        manager = ContextManager(session.profile.to_engine(), session.workspace, system_prompt=session.system_prompt)
        session.engine_state = manager.export_state(per_message=False)
        session.state_version += 1
        session.summary = ""
        for name in ("summary_version", "tokens_used", "turns_count", "compactions_count", "failures_count",
                     "messages_count", "live_count"):
            setattr(session, name, 0)
        session.save()


def import_failed(run: CompactionRun, error: str) -> None:
    """A failed import leaves an empty, closed session that says why, and the failed run."""
    session = run.session
    session.refresh_from_db()
    import_reset(session)
    session.status = AgentSession.Status.CLOSED
    session.source = {**(session.source or {}), "error": error}
    session.save(update_fields=["status", "source"])
    shutil.rmtree(import_source_dir(session.pk), ignore_errors=True)
    run.mark_failed(error)


def run_not_queued(run: CompactionRun, exc: Exception) -> None:
    error = f"the job could not be queued ({type(exc).__name__}: {exc}); nothing was started. Run it again."
    if run.trigger == "import":
        import_failed(run, error)
    else:
        run.mark_failed(error)
    run_announce(run)


def runs_reap(*, now: datetime | None = None) -> list[int]:
    """Fail every run marked running whose worker is gone, and every run queued for longer
    than ``CONTEXTLAB_QUEUED_MINUTES`` (its job was lost, or no worker runs); returns their ids.

    A job that does turn up later finds its run failed and does nothing.
    """
    reaped: list[int] = []
    minutes = settings.CONTEXTLAB_QUEUED_MINUTES
    cutoff = (now or timezone.now()) - timedelta(minutes=minutes)
    for stale in list(CompactionRun.objects.select_related("session")
                      .filter(status=CompactionRun.Status.QUEUED, created__lt=cutoff)):
        with jobs.hold_run(stale.pk) as held:
            # Held: a worker is taking it right now.
            if not held or not CompactionRun.objects.filter(pk=stale.pk, status=CompactionRun.Status.QUEUED).exists():
                continue
            log.warning("run %s (%s): queued for more than %s minutes; marking it failed", stale.pk, stale.trigger,
                        minutes)
            if stale.trigger == "import":
                import_failed(stale, NEVER_STARTED.format(minutes=minutes))
            else:
                stale.mark_failed(NEVER_STARTED.format(minutes=minutes))
            run_announce(stale)
            reaped.append(stale.pk)
    for run_id in list(CompactionRun.objects.filter(status=CompactionRun.Status.RUNNING)
                       .values_list("pk", flat=True)):
        with jobs.hold_run(run_id) as held:
            if not held:
                continue  # its worker is alive and holds it
            run = (CompactionRun.objects.select_related("session")
                   .filter(pk=run_id, status=CompactionRun.Status.RUNNING).first())
            if run is None:
                continue  # finished between the listing and the lock
            log.warning("run %s (%s): its worker died; marking it failed", run_id, run.trigger)
            if run.trigger == "import":
                import_failed(run, WORKER_DIED)
            else:
                run.mark_failed(WORKER_DIED)
            run_announce(run)
            reaped.append(run_id)
    return reaped


def runs_recover() -> tuple[list[int], list[int]]:
    """At the start of an embedded-mode process: fail the runs the previous process
    was running and start again the ones it had only queued. Returns (failed, queued)."""
    failed = runs_reap()
    queued = list(CompactionRun.objects.filter(status=CompactionRun.Status.QUEUED)
                  .values_list("pk", "trigger").order_by("pk"))
    for run_id, trigger in queued:
        jobs.enqueue(IMPORT_TRANSCRIPT if trigger == "import" else COMPACT_SESSION, run_id)
    return failed, [run_id for run_id, _ in queued]


