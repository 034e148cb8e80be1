"""Running background jobs in both modes, and knowing whether a run is still alive.

``enqueue(task, *args)`` is the one way to start a job. Both modes run the same
Celery tasks; only the transport differs:

* embedded (no Redis): after the transaction commits, the task runs eagerly on
  a small thread pool of the web process, so its ``live.publish`` calls reach
  the in-memory channel layer of that process;
* scaled: ``task.delay_on_commit`` puts it on the Redis broker for a
  ``celery worker`` process (with ``on_error``, a failure to reach the broker
  is reported to the caller instead of raised after its commit).

``hold_run(run_id)`` marks a run as being worked on for as long as the worker
lives: within a process, a set; across processes (PostgreSQL), a session-level
advisory lock, which the database drops the moment the worker's connection
closes, as a killed process's does at once. (SQLite means embedded mode, one
process, where the set is enough.) A run that says "running" while nobody
holds it belonged to a worker that died; ``services.runs_reap`` fails it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import close_old_connections, connection, transaction

if TYPE_CHECKING:
    from celery import Task

log = logging.getLogger(__name__)

# First key of the two-key advisory locks: "cl" + "run", so our locks never
# collide with another application's on the same database.
_LOCK_NAMESPACE = 0x636C_7275

_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()
_pending: set[Future[Any]] = set()
_pending_changed = threading.Condition()

_held: set[int] = set()
_held_lock = threading.Lock()

# The tasks this module starts itself, by name (see ``task_named``).
RECOVER_RUNS = "contextlab.sessions.tasks.recover_runs"

_embedded_started = False
_embedded_lock = threading.Lock()
_beat: Any = None


def embedded() -> bool:
    return bool(settings.CONTEXTLAB_JOBS_MODE == "embedded")


# -- enqueueing --------------------------------------------------------------------------


def task_named(name: str) -> Task:
    """The registered Celery task called ``name`` (e.g. ``"contextlab.sessions.tasks.compact_session"``).

    Workflows name the task they start instead of importing its module: the
    tasks import the workflows, so importing them back would close a circle.
    """
    from contextlab.celery import app

    if name not in app.tasks:
        # Task modules are imported when a worker starts; a web process (or a
        # test) that enqueues first imports them here, once.
        app.loader.import_default_modules()
    task: Task = app.tasks[name]
    return task


def enqueue(task: Task | str, *args: Any, on_error: Callable[[Exception], None] | None = None) -> None:
    """Run ``task(*args)`` in the background once the current transaction commits.

    ``task`` is the task or its registered name. ``on_error`` is called when the
    job cannot be handed over (the broker is down): the caller's row can then
    say so instead of waiting forever.
    """
    if isinstance(task, str):
        task = task_named(task)
    if not embedded():
        if on_error is None:
            task.delay_on_commit(*args)
        else:
            transaction.on_commit(lambda: _deliver(task, args, on_error))
        return
    transaction.on_commit(lambda: submit(task, *args))


def _deliver(task: Task, args: tuple[Any, ...], on_error: Callable[[Exception], None]) -> None:
    try:
        task.delay(*args)
    except Exception as exc:  # the work that asked for the job is committed; report, don't undo
        log.exception("could not queue %s%r", task.name, args)
        on_error(exc)


def _pool() -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=max(1, settings.CONTEXTLAB_JOB_THREADS),
                                           thread_name_prefix="contextlab-job")
        return _executor


def _run_eagerly(task: Task, args: tuple[Any, ...]) -> Any:
    # A pool thread lives on across jobs; like a request, a job starts and ends
    # without a stale or broken database connection.
    close_old_connections()
    try:
        # apply() is what apply_async() does under task_always_eager; calling it
        # directly keeps the job in this process whatever the configuration says.
        return task.apply(args=args, throw=True).result
    finally:
        # Not kept for the next job: an idle pool thread would hold it open.
        connection.close()


def _done(future: Future[Any]) -> None:
    if not future.cancelled() and future.exception() is not None:
        # The task recorded the failure on its run row; this is for the log.
        log.error("background job failed", exc_info=future.exception())
    with _pending_changed:
        _pending.discard(future)
        _pending_changed.notify_all()


def submit(task: Task, *args: Any) -> Future[Any]:
    """Run ``task(*args)`` on the embedded pool now (``enqueue`` waits for the commit first)."""
    with _pending_changed:
        future = _pool().submit(_run_eagerly, task, args)
        _pending.add(future)
    future.add_done_callback(_done)
    return future


def drain(timeout: float = 30.0) -> bool:
    """Wait until the embedded pool has finished every job submitted so far,
    including jobs those jobs submitted; False on timeout."""
    with _pending_changed:
        return _pending_changed.wait_for(lambda: not _pending, timeout=timeout)


# -- liveness of runs --------------------------------------------------------------------


@contextlib.contextmanager
def hold_run(run_id: int) -> Iterator[bool]:
    """Mark run ``run_id`` as being worked on here; yields False when someone else holds it.

    Take it before changing the run's status and keep it until the run is
    finished, so that "running and not held" always means "its worker died".
    """
    # In this process: a set (threads of one process share it). PostgreSQL's
    # advisory locks are re-entrant within one connection, so the set also
    # keeps one thread from taking a run twice.
    with _held_lock:
        acquired = run_id not in _held
        if acquired:
            _held.add(run_id)
    if not acquired:
        yield False
        return
    try:
        if connection.vendor != "postgresql":
            yield True
            return
        # Across processes: a session-level advisory lock, which PostgreSQL drops
        # with the connection, i.e. the moment a killed worker's socket closes.
        key = int(run_id) & 0x7FFF_FFFF
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [_LOCK_NAMESPACE, key])
            row = cursor.fetchone()
        locked = bool(row and row[0])
        try:
            yield locked
        finally:
            if locked:
                try:
                    with connection.cursor() as cursor:
                        cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [_LOCK_NAMESPACE, key])
                except Exception:
                    # A broken connection released the lock when it broke.
                    log.warning("could not release the lock of run %s", run_id, exc_info=True)
    finally:
        with _held_lock:
            _held.discard(run_id)


# -- embedded mode start-up --------------------------------------------------------------


def start_embedded() -> None:
    """In embedded mode, start the beat thread and recover the runs a previous process left.

    Called once from ``contextlab/asgi.py`` (not from ``AppConfig.ready``,
    which also runs for every management command). Does nothing in scaled
    mode or when ``CONTEXTLAB_EMBEDDED_BEAT`` is off.
    """
    global _embedded_started, _beat
    if not embedded() or not settings.CONTEXTLAB_EMBEDDED_BEAT:
        return
    with _embedded_lock:
        if _embedded_started:
            return
        _embedded_started = True
    from celery.beat import EmbeddedService

    from contextlab.celery import app

    # The previous process's in-memory job queue died with it: fail the runs it
    # was running and start again the ones it had not started.
    submit(task_named(RECOVER_RUNS))
    settings.VAR_DIR.mkdir(parents=True, exist_ok=True)
    _beat = EmbeddedService(app, thread=True, schedule_filename=settings.CELERY_BEAT_SCHEDULE_FILENAME)
    _beat.start()
    log.info("embedded jobs: %d worker thread(s) and the beat thread started", settings.CONTEXTLAB_JOB_THREADS)


def stop_embedded(timeout: float = 10.0) -> None:
    """Stop the beat thread and wait for the running jobs (a server shutting down, or a test)."""
    global _embedded_started, _beat
    with _embedded_lock:
        beat, _beat = _beat, None
        _embedded_started = False
    if beat is not None:
        beat.stop()
        beat.join(timeout)
    drain(timeout)
