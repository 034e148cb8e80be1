"""Consolidate the recent daily notes into each workspace's MEMORY.md (backup first).

With no option it does what the scheduled task does every quarter hour: the
profiles whose local midnight has just passed. Operators without a beat
process can run exactly that from cron (``*/15 * * * *``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from contextlab.sessions import services
from contextlab.sessions.models import AgentProfile


class Command(BaseCommand):
    help = ("Merge the recent daily notes (memory/YYYY-MM-DD.md) into MEMORY.md, after a backup, for the "
            "profiles whose local midnight has just passed, or for the profiles named with --now.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--at", help="the moment to act as of (ISO 8601 with offset); default: now")
        parser.add_argument("--now", action="store_true",
                            help="consolidate now, up to yesterday in each profile's timezone, "
                                 "instead of waiting for local midnight")
        parser.add_argument("--profile", action="append", default=[],
                            help="only this profile (id or name); repeat for several")
        parser.add_argument("--days", type=int, help="how many days of notes to merge (default: the setting)")

    def handle(self, *args: Any, **options: Any) -> None:
        now = timezone.now()
        if options["at"]:
            parsed = parse_datetime(options["at"])
            if parsed is None or parsed.tzinfo is None:
                raise CommandError(f"--at must be an ISO 8601 date and time with a UTC offset, not {options['at']!r}")
            now = parsed
        if options["days"] is not None and options["days"] < 1:
            raise CommandError("--days must be at least 1")
        profiles = list(AgentProfile.objects.all())
        if options["profile"]:
            wanted = set(options["profile"])
            profiles = [p for p in profiles if p.name in wanted or str(p.pk) in wanted]
            if not profiles:
                raise CommandError(f"no profile {', '.join(sorted(wanted))}")
        if options["now"]:
            changed = []
            for profile in profiles:
                local = now.astimezone(services.profile_zone(profile.timezone))
                changed.extend(services.memory_consolidate(profile=profile, day=local.date() - timedelta(days=1),
                                                           now=local, days=options["days"]))
        else:
            changed = services.memory_consolidate_due(now=now, profile_ids=[p.pk for p in profiles],
                                                      days=options["days"])
        for item in changed:
            backup = f" (previous version kept in {item.backup})" if item.backup else ""
            self.stdout.write(f"session {item.session_id} [{item.profile}]: MEMORY.md updated up to {item.day}: "
                              f"{len(item.added)} added, {len(item.removed)} removed{backup}")
            if options["verbosity"] > 1:
                self.stdout.write(item.diff)
        self.stdout.write(f"{len(changed)} MEMORY.md file(s) changed")
