from __future__ import annotations

import functools
import threading

import pytest
from django.db import transaction

from contextlab.celery import task
from contextlab.support import jobs

ran: list[tuple[str, tuple[object, ...], bool]] = []


@task(name="tests.jobs.record")
def record(*args: object) -> str:
    ran.append((threading.current_thread().name, args, bool(record.request.is_eager)))
    return "ok"


@task(name="tests.jobs.explode")
def explode() -> None:
    raise RuntimeError("boom")


@pytest.fixture(autouse=True)
def _clean() -> None:
    ran.clear()


def test_it_runs_the_job_on_the_pool_once_the_transaction_commits(db, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks:
        jobs.enqueue(record, 7, "x")
        assert ran == []  # nothing before the commit
    assert len(callbacks) == 1
    callbacks[0]()
    assert jobs.drain(10)
    [(thread, args, eager)] = ran
    assert thread.startswith("contextlab-job")
    assert args == (7, "x")
    assert eager


@pytest.mark.django_db(transaction=True)
def test_it_never_runs_the_job_of_a_transaction_that_rolled_back():
    with pytest.raises(RuntimeError), transaction.atomic():
        jobs.enqueue(record, 1)
        raise RuntimeError("rolled back")
    with transaction.atomic():
        jobs.enqueue(record, 2)
    assert jobs.drain(10)
    assert [args for _, args, _ in ran] == [(2,)]


@pytest.mark.django_db(transaction=True)
def test_it_runs_at_once_outside_a_transaction():
    jobs.enqueue(record, 3)
    assert jobs.drain(10)
    assert [args for _, args, _ in ran] == [(3,)]


def test_it_keeps_a_failing_job_from_stopping_the_pool(db, caplog):
    future = jobs.submit(explode)
    assert jobs.drain(10)
    assert isinstance(future.exception(), RuntimeError)
    assert "background job failed" in caplog.text
    jobs.submit(record, 4)
    assert jobs.drain(10)
    assert [args for _, args, _ in ran] == [(4,)]


def test_it_hands_the_job_to_the_broker_on_commit_in_scaled_mode(db, settings, django_capture_on_commit_callbacks):
    settings.CONTEXTLAB_JOBS_MODE = "scaled"
    with django_capture_on_commit_callbacks() as callbacks:
        jobs.enqueue(record, 5)
    # delay_on_commit: the callback sends the task to the broker (the scaled
    # tests run it against a real Redis and worker); nothing runs here.
    [callback] = callbacks
    assert isinstance(callback, functools.partial)
    assert callback.func == record.delay
    assert callback.args == (5,)
    assert ran == []


def test_it_holds_a_run_in_one_place_at_a_time(db):
    with jobs.hold_run(41) as first:
        assert first
        with jobs.hold_run(41) as second:
            assert not second
        with jobs.hold_run(42) as other:
            assert other
    with jobs.hold_run(41) as again:
        assert again
