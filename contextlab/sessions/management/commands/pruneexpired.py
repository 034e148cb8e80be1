"""Delete offloaded tool outputs past their retention, sparing those still referenced.

The same service the daily Celery task calls, for operators who run jobs from
cron instead of a beat process.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.dateparse import parse_datetime

from contextlab.sessions import services


class Command(BaseCommand):
    help = ("Delete the offloaded tool outputs (tool_result/*.txt) older than their profile's retention_days, "
            "except the ones the live context still references.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--at", help="judge expiry as of this moment (ISO 8601 with offset); default: now")

    def handle(self, *args: Any, **options: Any) -> None:
        now = None
        if options["at"]:
            now = parse_datetime(options["at"])
            if now is None or now.tzinfo is None:
                raise CommandError(f"--at must be an ISO 8601 date and time with a UTC offset, not {options['at']!r}")
        result = services.offloaded_prune(now=now)
        for path in result.removed:
            self.stdout.write(f"deleted {path}")
        self.stdout.write(
            f"{len(result.removed)} file(s) deleted in {result.sessions} session(s); "
            f"{result.kept_referenced} expired file(s) kept because the live context references them")
