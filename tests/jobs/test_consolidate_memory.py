"""Nightly consolidation of long-term memory, driven by a fixed clock."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from io import StringIO
from zoneinfo import ZoneInfo

import pytest
from django.core.management import call_command

from contextlab.engine.memory.long_term import MemoryNotes, append_daily_note
from contextlab.sessions import services
from contextlab.sessions.tasks import consolidate_memory

OLD_MEMORY = "# Long-term memory\n\n## Preferences\n- [2026-03-01] I prefer tabs over spaces\n"
QUARTER = timedelta(minutes=15)


@pytest.fixture
def kathmandu_session(alice):
    """A session whose profile lives at UTC+05:45, with yesterday's note and an older MEMORY.md."""
    profile = services.profile_create(owner=alice, name="kathmandu", knobs={"timezone": "Asia/Kathmandu"})
    session = services.session_create(owner=alice, system_prompt="", profile=profile)
    (session.workspace / "MEMORY.md").write_text(OLD_MEMORY, encoding="utf-8")
    append_daily_note(session.workspace, MemoryNotes(
        preferences=["Please always run the tests before committing"],
        lessons=["pip install failed offline; installing from the local wheel folder worked"]),
        day=date(2026, 3, 9), now=datetime(2026, 3, 9, 15, 0, tzinfo=ZoneInfo("Asia/Kathmandu")))
    return session


@pytest.fixture
def utc_session(alice):
    session = services.session_create(owner=alice, system_prompt="")
    (session.workspace / "MEMORY.md").write_text(OLD_MEMORY, encoding="utf-8")
    append_daily_note(session.workspace, MemoryNotes(preferences=["Never force-push"], lessons=[]),
                      day=date(2026, 3, 9), now=datetime(2026, 3, 9, 15, 0, tzinfo=UTC))
    return session


# Local midnight in Kathmandu (UTC+05:45) on 10 March 2026 is 18:15 UTC on the 9th.
KATHMANDU_MIDNIGHT = datetime(2026, 3, 9, 18, 15, tzinfo=UTC)


def test_it_consolidates_at_local_midnight_after_a_backup(kathmandu_session, utc_session):
    # The beat fires a few seconds after the quarter.
    changed = services.memory_consolidate_due(now=KATHMANDU_MIDNIGHT + timedelta(seconds=4))
    assert [c.session_id for c in changed] == [str(kathmandu_session.pk)]
    [result] = changed
    assert result.day == date(2026, 3, 9)
    workspace = kathmandu_session.workspace
    memory = (workspace / "MEMORY.md").read_text(encoding="utf-8")
    assert "Please always run the tests before committing" in memory
    assert "installing from the local wheel folder worked" in memory
    assert "I prefer tabs over spaces" in memory
    # The previous MEMORY.md was copied aside before it was rewritten.
    assert result.backup is not None
    assert (workspace / result.backup).read_text(encoding="utf-8") == OLD_MEMORY
    assert "+- [2026-03-09] Please always run the tests before committing" in result.diff
    # The UTC profile's midnight is hours away: its MEMORY.md is untouched.
    assert (utc_session.workspace / "MEMORY.md").read_text(encoding="utf-8") == OLD_MEMORY


def test_it_does_nothing_before_or_well_after_local_midnight(kathmandu_session):
    assert services.memory_consolidate_due(now=KATHMANDU_MIDNIGHT - timedelta(minutes=1)) == []
    assert services.memory_consolidate_due(now=KATHMANDU_MIDNIGHT + QUARTER) == []
    assert (kathmandu_session.workspace / "MEMORY.md").read_text(encoding="utf-8") == OLD_MEMORY


def test_it_changes_nothing_when_run_twice_for_the_same_night(kathmandu_session):
    assert services.memory_consolidate_due(now=KATHMANDU_MIDNIGHT)
    assert services.memory_consolidate_due(now=KATHMANDU_MIDNIGHT) == []


def test_it_runs_as_the_scheduled_task_with_a_fixed_clock(utc_session):
    result = consolidate_memory.apply(kwargs={"at": "2026-03-10T00:00:02+00:00"}).get()
    assert result == [f"{utc_session.pk}: +1 -0"]
    assert "Never force-push" in (utc_session.workspace / "MEMORY.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("zone", ["UTC", "Asia/Kathmandu", "America/Santiago", "Australia/Lord_Howe",
                                  "Pacific/Chatham", "Europe/Berlin"])
def test_it_finds_each_local_midnight_exactly_once_across_daylight_saving_changes(zone):
    # Ten days around Chile's and Lord Howe's September/October changes (Chile's
    # is at local midnight, Lord Howe's shifts by half an hour).
    tz = ZoneInfo(zone)
    tick = datetime(2026, 9, 1, tzinfo=UTC)
    days: list[date] = []
    while tick < datetime(2026, 10, 11, tzinfo=UTC):
        day = services.memory_day_due(tz, tick, QUARTER)
        if day is not None:
            days.append(day)
        tick += QUARTER
    assert days == sorted(set(days))
    first = days[0]
    assert days == [first + timedelta(days=n) for n in range(len(days))]
    assert len(days) in (39, 40)


def test_the_command_consolidates_now_when_asked(kathmandu_session, utc_session):
    out = StringIO()
    call_command("consolidatememory", "--now", "--profile", "kathmandu",
                 "--at", "2026-03-10T12:00:00+00:00", stdout=out)
    assert "1 MEMORY.md file(s) changed" in out.getvalue()
    assert "previous version kept in backup/MEMORY-" in out.getvalue()
    assert (utc_session.workspace / "MEMORY.md").read_text(encoding="utf-8") == OLD_MEMORY


def test_the_command_does_what_the_schedule_does_by_default(kathmandu_session):
    out = StringIO()
    call_command("consolidatememory", "--at", KATHMANDU_MIDNIGHT.isoformat(), stdout=out)
    assert "1 MEMORY.md file(s) changed" in out.getvalue()
