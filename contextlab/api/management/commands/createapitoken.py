from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError, CommandParser

from contextlab.api.models import ApiToken


class Command(BaseCommand):
    help = "Issue an API token for USERNAME. The token is printed once, on the last line, and never stored."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", default="", help="a label to tell tokens apart")

    def handle(self, *args: Any, **options: Any) -> None:
        user = User.objects.filter(username=options["username"]).first()
        if user is None:
            raise CommandError(f"no user named {options['username']!r}")
        row, token = ApiToken.issue(user=user, name=options["name"])
        self.stderr.write(f"Token {row.prefix}… issued for {user.username}; use it as 'Authorization: Bearer <token>'.")
        # Last line of stdout, alone, so scripts can take it with `tail -n 1`.
        self.stdout.write(token)
