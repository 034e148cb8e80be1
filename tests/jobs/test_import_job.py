"""Importing a transcript in the background: the replay runs on the pool, with progress."""

from __future__ import annotations

import shutil

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import transaction
from django.utils import timezone

from contextlab.engine.core.errors import ContextLabError
from contextlab.engine.importers import load_transcript
from contextlab.sessions import services
from contextlab.sessions.models import AgentSession, CompactionRun, SessionMessage, Turn
from contextlab.sessions.services import imports, runs
from contextlab.support import jobs
from tests.conversations import DEMO_CONVERSATION
from tests.invariants import assert_nothing_lost

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def demo_profile(alice):
    return services.profile_create(owner=alice, name="demo", knobs={
        "max_input_length": 4_000, "recent_max_bytes": 4_000, "old_max_bytes": 1_000})


def _upload() -> SimpleUploadedFile:
    return SimpleUploadedFile("demo.json", DEMO_CONVERSATION.read_bytes(), content_type="application/json")


def test_it_replays_in_the_background_and_reports_progress(alice, demo_profile, viewer):
    # The job starts when the outer transaction commits, once the page listens.
    with transaction.atomic():
        session, run = services.transcript_import_enqueue(owner=alice, upload=_upload(), profile=demo_profile)
        assert run is not None and run.trigger == "import"
        assert session.status == AgentSession.Status.IMPORTING
        page = viewer(session.pk)
    assert jobs.drain(60)
    run.refresh_from_db()
    session.refresh_from_db()
    assert run.status == CompactionRun.Status.DONE and run.outcome == "imported"
    assert session.status == AgentSession.Status.ACTIVE
    assert Turn.objects.filter(session=session).count() == 15
    assert session.messages_count == 31
    assert_nothing_lost(session)
    # The uploaded copy is gone once it is imported.
    assert not runs.import_source_dir(session.pk).exists()

    updates = [e for e in page.events() if e["type"] == "run.update"]
    assert updates[-1]["run"]["status"] == "done"
    assert updates[-1]["done"] == updates[-1]["total"] == 31
    progress = [e["done"] for e in updates if "done" in e]
    assert progress == sorted(progress)


def test_it_refuses_an_unreadable_transcript_before_writing_anything(alice, tmp_path):
    bad = tmp_path / "notes.txt"
    bad.write_text("not a transcript")
    with pytest.raises(ContextLabError):
        services.transcript_import_enqueue(owner=alice, path=bad)
    assert not AgentSession.objects.exists() and not CompactionRun.objects.exists()


def test_it_restores_a_bundle_at_once(alice, alice_session, settings):
    data = services.session_export(session=alice_session)
    path = settings.WORKSPACES_DIR / "bundle.zip"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    session, run = services.transcript_import_enqueue(owner=alice, path=path)
    assert run is None
    assert session.status == AgentSession.Status.ACTIVE


def test_it_leaves_a_closed_empty_session_that_says_why_when_the_replay_fails(alice, demo_profile):
    with transaction.atomic():
        session, run = services.transcript_import_enqueue(owner=alice, upload=_upload(), profile=demo_profile)
        assert run is not None
        shutil.rmtree(runs.import_source_dir(session.pk))
    assert jobs.drain(60)
    run.refresh_from_db()
    session.refresh_from_db()
    assert run.status == CompactionRun.Status.FAILED and "upload it again" in run.error
    assert session.status == AgentSession.Status.CLOSED
    assert session.source["error"] == run.error
    assert not SessionMessage.objects.filter(session=session).exists()
    assert session.turns_count == 0


def _enqueued_but_not_run(alice, profile) -> tuple[AgentSession, CompactionRun]:
    """An import whose job found the run held elsewhere and did nothing."""
    with transaction.atomic():
        session, run = services.transcript_import_enqueue(owner=alice, upload=_upload(), profile=profile)
        assert run is not None
        hold = jobs.hold_run(run.pk)
        assert hold.__enter__()
    try:
        assert jobs.drain(30)
    finally:
        hold.__exit__(None, None, None)
    run.refresh_from_db()
    assert run.status == CompactionRun.Status.QUEUED
    return session, run


def test_it_starts_again_from_scratch_when_an_import_is_retried(alice, demo_profile):
    session, run = _enqueued_but_not_run(alice, demo_profile)
    # A first worker replayed part of it, then died.
    imports._replay(session, load_transcript(next(runs.import_source_dir(session.pk).glob("*"))).messages[:6])
    CompactionRun.objects.filter(pk=run.pk).update(status="running", started=timezone.now())
    assert services.transcript_import_work(run_id=run.pk) == "done"
    session.refresh_from_db()
    assert session.messages_count == 31
    assert Turn.objects.filter(session=session).count() == 15
    assert_nothing_lost(session)


def test_it_fails_an_import_whose_worker_died(alice, demo_profile):
    session, run = _enqueued_but_not_run(alice, demo_profile)
    CompactionRun.objects.filter(pk=run.pk).update(status="running", started=timezone.now())
    assert services.runs_reap() == [run.pk]
    session.refresh_from_db()
    assert session.status == AgentSession.Status.CLOSED
    assert "stopped before it finished" in session.source["error"]
