"""Celery tasks: thin wrappers that take ids and call one service each.

Start them with ``contextlab.support.jobs.enqueue`` (never ``.delay`` directly), so
the embedded and the scaled mode behave the same. The run rows, not Celery
results, say how a job went.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from celery import Task
from django.utils.dateparse import parse_datetime

from contextlab.celery import task
from contextlab.sessions import services

log = logging.getLogger(__name__)

# A second delivery of a job another worker is still running (or whose dead
# worker's database session is still closing) tries again every few seconds
# for two minutes; then the sweep for dead workers settles the run. Embedded
# mode has one process, so there it never waits.
BUSY_RETRY_SECONDS = 5
BUSY_RETRIES = 24


def _moment(at: str | None) -> datetime | None:
    """A fixed clock for a run by hand (``at``, ISO 8601); None means now."""
    if at is None:
        return None
    moment = parse_datetime(at)
    if moment is None or moment.tzinfo is None:
        raise ValueError(f"not an ISO 8601 date and time with a UTC offset: {at!r}")
    return moment


@task(bind=True, max_retries=BUSY_RETRIES)
def compact_session(self: Task, run_id: int) -> str:
    outcome = services.compaction_work(run_id=run_id)
    if outcome == "busy" and not self.request.is_eager:
        raise self.retry(countdown=BUSY_RETRY_SECONDS)
    return outcome


@task(bind=True, max_retries=BUSY_RETRIES)
def import_transcript(self: Task, run_id: int) -> str:
    outcome = services.transcript_import_work(run_id=run_id)
    if outcome == "busy" and not self.request.is_eager:
        raise self.retry(countdown=BUSY_RETRY_SECONDS)
    return outcome


@task()
def prune_expired_files(at: str | None = None) -> dict[str, Any]:
    result = services.offloaded_prune(now=_moment(at))
    return {"sessions": result.sessions, "removed": len(result.removed), "kept_referenced": result.kept_referenced}


@task()
def consolidate_memory(at: str | None = None) -> list[str]:
    return [f"{c.session_id}: +{len(c.added)} -{len(c.removed)}" for c in services.memory_consolidate_due(now=_moment(at))]


@task()
def reap_stale_runs() -> list[int]:
    return services.runs_reap()


@task()
def recover_runs() -> dict[str, list[int]]:
    failed, queued = services.runs_recover()
    return {"failed": failed, "queued": queued}


@task()
def what_if_run(run_id: int) -> str:
    return str(services.whatif_execute(run_id))
