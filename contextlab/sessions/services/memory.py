"""Consolidating a profile's long-term memory, per day in the profile's time zone."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.utils import timezone

from contextlab.sessions.models import (
    AgentProfile,
    AgentSession,
)

log = logging.getLogger(__name__)


@dataclass
class MemoryConsolidation:
    session_id: str
    profile: str
    day: date
    backup: str | None
    diff: str
    added: list[str]
    removed: list[str]


def profile_zone(name: str) -> Any:
    """The profile's timezone; UTC (with a warning) when the name is unknown."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        log.warning("unknown timezone %r; using UTC", name)
        return ZoneInfo("UTC")


def memory_consolidate(*, profile: AgentProfile, day: date, now: datetime,
                       days: int | None = None) -> list[MemoryConsolidation]:
    """Merge the daily notes up to ``day`` into ``MEMORY.md`` in every workspace of the
    profile's sessions (the engine backs the old file up first); only changed ones are returned."""
    from contextlab.engine.memory.long_term import consolidate

    days = days or settings.CONTEXTLAB_MEMORY_DAYS
    changed: list[MemoryConsolidation] = []
    sessions = AgentSession.objects.filter(profile=profile).exclude(status=AgentSession.Status.IMPORTING)
    for session in sessions.only("id", "profile_id"):
        workspace = Path(settings.WORKSPACES_DIR) / str(session.pk)
        if not workspace.is_dir():
            continue
        try:
            result = consolidate(workspace, days=days, today=day, now=now)
        except Exception:  # one broken workspace must not stop the others
            log.exception("session %s: memory consolidation failed", session.pk)
            continue
        if result.diff:
            changed.append(MemoryConsolidation(
                session_id=str(session.pk), profile=profile.name, day=day,
                backup=str(result.backup_path.relative_to(workspace)) if result.backup_path else None,
                diff=result.diff, added=list(result.added), removed=list(result.removed)))
    return changed


def memory_day_due(zone: Any, tick: datetime, every: timedelta) -> date | None:
    """The local day that ended, when a local midnight of ``zone`` fell in (tick - every, tick].

    The local dates are compared, not the clock times, so a midnight that a
    daylight-saving change skips (23:59 -> 01:00) still counts, once. Running
    again for a day already merged changes nothing, so a repeat is harmless.
    """
    local_tick = tick.astimezone(zone)
    if (tick - every).astimezone(zone).date() == local_tick.date():
        return None
    return local_tick.date() - timedelta(days=1)


def memory_consolidate_due(*, now: datetime | None = None, every: timedelta = timedelta(minutes=15),
                           profile_ids: list[int] | None = None, days: int | None = None) -> list[MemoryConsolidation]:
    """The nightly job, run every ``every``: consolidate, up to the day that just
    ended, the profiles whose local midnight fell in the interval that ended at
    the last tick before ``now``. Stateless: a tick the scheduler misses skips
    that night, and the next night's run merges the notes it would have."""
    moment = now or timezone.now()
    step = int(every.total_seconds())
    tick = datetime.fromtimestamp(int(moment.timestamp()) // step * step, tz=UTC)
    profiles = AgentProfile.objects.all()
    if profile_ids is not None:
        profiles = profiles.filter(pk__in=profile_ids)
    changed: list[MemoryConsolidation] = []
    for profile in profiles:
        zone = profile_zone(profile.timezone)
        day = memory_day_due(zone, tick, every)
        if day is not None:
            changed.extend(memory_consolidate(profile=profile, day=day, now=moment.astimezone(zone), days=days))
    return changed
