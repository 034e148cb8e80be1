"""Create the demo user and one demo session, once.

The session replays a real transcript from the shared corpus (tau-bench, an
airline customer-service agent) with a small window so compaction fires; when
the corpus is not there it replays the small conversation shipped beside this
app instead. Running it again changes nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandParser

from contextlab.sessions import services
from contextlab.sessions.models import AgentProfile, AgentSession

TAU_BENCH = Path("tau-bench") / "gpt-4o-airline.idx52.task2.trial1.json"
DEMO_CONVERSATION = Path(__file__).resolve().parents[2] / "demo_conversation.json"
# A 4,000-token window (threshold 2,800, reserve 400) and small byte limits:
# both truncation stages and several compactions happen within a few turns.
DEMO_PROFILE = {"max_input_length": 4_000, "recent_max_bytes": 4_000, "old_max_bytes": 1_000}


def corpus_dir() -> Path:
    default = Path(settings.BASE_DIR).parent / "shared" / "corpus" / "raw"
    return Path(os.environ.get("CONTEXTLAB_CORPUS_DIR") or default)


class Command(BaseCommand):
    help = "Create the 'demo' user (password 'demo') and import one demo session. Idempotent."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--corpus", help="corpus folder (default: $CONTEXTLAB_CORPUS_DIR or ../shared/corpus/raw)")

    def handle(self, *args: Any, **options: Any) -> None:
        user = User.objects.filter(username="demo").first()
        if user is None:
            user = User.objects.create_user("demo", password="demo")
            self.stdout.write("Created user 'demo' with password 'demo'.")
        else:
            self.stdout.write("User 'demo' exists (password 'demo' unless someone changed it).")

        profile = AgentProfile.objects.filter(owner=user, name="demo").first()
        if profile is None:
            profile = services.profile_create(owner=user, name="demo", knobs=DEMO_PROFILE)

        source = (Path(options["corpus"]) if options.get("corpus") else corpus_dir()) / TAU_BENCH
        if not source.is_file():
            self.stdout.write(f"No corpus transcript at {source}; using the shipped demo conversation.")
            source = DEMO_CONVERSATION
        title = f"Demo: {source.name}"
        existing = AgentSession.objects.filter(owner=user, title=title).first()
        if existing is not None:
            self.stdout.write(f"Demo session already there: {existing.get_absolute_url()}")
            return
        session = services.transcript_import(owner=user, path=source, profile=profile, title=title)
        self.stdout.write(
            f"Imported {source.name}: {session.turns_count} turns, {session.compactions_count} compaction(s). "
            f"Open {session.get_absolute_url()} and log in as demo / demo.")
