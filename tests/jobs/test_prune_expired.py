"""Retention of offloaded tool outputs, judged with a fixed clock."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from contextlab.sessions import services
from contextlab.sessions.models import OffloadedFile
from contextlab.sessions.tasks import prune_expired_files
from tests.conversations import answer, tool_turn
from tests.invariants import assert_nothing_lost


@pytest.fixture
def offloading_session(alice, alice_session):
    """Three big tool outputs saved to tool_result/, then a compaction that archives the first two."""
    for i in range(1, 4):
        services.messages_append(session=alice_session, messages=[*([answer(i - 1)] if i > 1 else []),
                                                                 *tool_turn(i, output_bytes=3_000)])
    assert OffloadedFile.objects.filter(session=alice_session).count() == 3
    services.compaction_run(session=alice_session)
    alice_session.refresh_from_db()
    return alice_session


def _files(session) -> dict[str, bool]:
    return {row.path: (session.workspace / row.path).is_file()
            for row in OffloadedFile.objects.filter(session=session)}


def test_it_deletes_expired_unreferenced_files_and_keeps_referenced_ones(offloading_session):
    session = offloading_session
    referenced = set(OffloadedFile.objects.filter(session=session, referenced=True).values_list("path", flat=True))
    unreferenced = set(OffloadedFile.objects.filter(session=session, referenced=False).values_list("path", flat=True))
    assert len(referenced) == 1 and len(unreferenced) == 2

    # Within the 30-day retention nothing goes.
    early = services.offloaded_prune(now=timezone.now() + timedelta(days=29))
    assert early.removed == []
    assert all(_files(session).values())

    result = services.offloaded_prune(now=timezone.now() + timedelta(days=31))
    assert sorted(result.removed) == sorted(f"{session.pk}/{path}" for path in unreferenced)
    assert result.kept_referenced == 1
    files = _files(session)
    assert all(files[path] for path in referenced)  # the live context still points to it
    assert not any(files[path] for path in unreferenced)
    # The rows stay: the ledger still tells what was cut and where it went.
    assert OffloadedFile.objects.filter(session=session).count() == 3
    assert set(OffloadedFile.objects.filter(session=session, referenced=True)
               .values_list("path", flat=True)) == referenced
    # The archive holds the originals of the archived messages, so nothing is lost.
    assert_nothing_lost(session)

    # Already pruned: the session is not even loaded again.
    again = services.offloaded_prune(now=timezone.now() + timedelta(days=32))
    assert again.removed == [] and again.sessions == 0


def test_it_runs_as_the_scheduled_task_with_a_fixed_clock(offloading_session):
    at = (timezone.now() + timedelta(days=31)).isoformat()
    result = prune_expired_files.apply(kwargs={"at": at}).get()
    assert result == {"sessions": 1, "removed": 2, "kept_referenced": 1}


def test_it_honours_a_shorter_retention_of_the_profile(offloading_session):
    profile = offloading_session.profile
    profile.retention_days = 1
    profile.save()
    result = services.offloaded_prune(now=timezone.now() + timedelta(days=2))
    assert len(result.removed) == 2


def test_the_command_prints_what_it_deleted(offloading_session):
    out = StringIO()
    call_command("pruneexpired", "--at", (timezone.now() + timedelta(days=31)).isoformat(), stdout=out)
    text = out.getvalue()
    assert len([line for line in text.splitlines() if line.startswith("deleted ")]) == 2
    assert "2 file(s) deleted in 1 session(s); 1 expired file(s) kept because the live context references them" in text


def test_the_command_refuses_a_date_without_an_offset(db):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="UTC offset"):
        call_command("pruneexpired", "--at", "2026-01-01T00:00:00")
