"""Load the demo sessions, once.

The session replays a real transcript from the shared corpus (tau-bench, an
airline customer-service agent) with a small window so compaction fires; when
the corpus is not there it replays the small conversation shipped beside this
app instead. Beside it, the shipped conversation is replayed under the faithful
``copaw`` policy (and, when the main session is another transcript, under
``contextlab`` too): the user's audit ticket that CoPaw's compaction loses and
contextlab keeps is the story the landing page tells. Running it again changes
nothing.

It belongs to the well-known login ``demo`` / ``demo``, created here, only on
the embedded SQLite database of a one-machine start. On any other database (a
shared PostgreSQL, which scaled web processes serve to whoever reaches them)
that login is never created: the session goes to an existing user named with
``--owner``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection

from contextlab.dashboard import demo_story
from contextlab.sessions import services
from contextlab.sessions.models import AgentProfile, AgentSession

TAU_BENCH = Path("tau-bench") / "gpt-4o-airline.idx52.task2.trial1.json"
# The shipped demo conversation is data of the sessions app, beside its models.
DEMO_CONVERSATION = Path(__file__).resolve().parents[3] / "sessions" / "demo_conversation.json"
# A 4,000-token window (threshold 2,800, reserve 400) and small byte limits:
# both truncation stages and several compactions happen within a few turns.
DEMO_PROFILE = {"max_input_length": 4_000, "recent_max_bytes": 4_000, "old_max_bytes": 1_000}


def corpus_dir() -> Path:
    default = Path(settings.BASE_DIR).parent / "shared" / "corpus" / "raw"
    return Path(os.environ.get("CONTEXTLAB_CORPUS_DIR") or default)


class Command(BaseCommand):
    help = ("Import one demo session. On the embedded SQLite database it belongs to the user 'demo' "
            "(password 'demo'), created if missing; on any other database name an existing user with --owner. "
            "Idempotent.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--corpus", help="corpus folder (default: $CONTEXTLAB_CORPUS_DIR or ../shared/corpus/raw)")
        parser.add_argument("--owner", metavar="USERNAME",
                            help="an existing user who gets the demo session; no 'demo' login is created")

    def handle(self, *args: Any, **options: Any) -> None:
        if not embedded_database():
            self._warn_if_demo_login_left()
        if options.get("owner"):
            user = User.objects.filter(username=options["owner"]).first()
            if user is None:
                raise CommandError(f"There is no user {options['owner']!r}: create one first "
                                   "(python manage.py createsuperuser).")
        elif not embedded_database():
            raise CommandError(
                f"This database is not the embedded SQLite one (it is {connection.vendor}): the well-known "
                "login demo / demo is never created on a shared database. Create an account with "
                "`python manage.py createsuperuser`, then load the demo for it with "
                "`python manage.py loaddemo --owner USERNAME`.")
        else:
            user = self._demo_user()

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
        # The landing page tells the demo's story: a fact the user gave that compaction lost, found
        # and checked by the session search now (nothing is claimed when there is none).
        story = demo_story.record(session)
        self.stdout.write(
            f"Imported {source.name}: {session.turns_count} turns, {session.compactions_count} compaction(s). "
            f"Open {session.get_absolute_url()} and log in as {user.get_username()}.")
        if story:
            fate = "lost" if story["kind"] == "lost" else f"kept by summary v{story['version']}"
            self.stdout.write(f"The demo's story: {story['needle']!r} (message #{story['seq']}), compacted in turn "
                              f"{story['turn']}: {fate}.")
        # The true story of a loss: the shipped conversation (a user's audit ticket in its first
        # message) replayed under CoPaw's own policy, which loses it, and under contextlab, which
        # keeps it. The landing page links to that loss.
        copaw_session = self._story_session(user, "copaw")
        same = session if source == DEMO_CONVERSATION else self._story_session(user, "contextlab")
        loss = demo_story.record_loss(session, copaw_session, same)
        if loss:
            fate = loss["compare"]["fate"]
            kept = (f"the contextlab session kept it (summary v{fate['version']})" if fate and fate["kept"]
                    else "the contextlab session did not keep it either" if fate
                    else "the contextlab session never compacted it")
            self.stdout.write(f"The copaw policy lost {loss['needle']!r} (message #{loss['seq']}) in turn "
                              f"{loss['turn']}; {kept}.")

    def _story_session(self, user: User, policy: str) -> AgentSession:
        """The shipped conversation under ``policy``, imported once (the demo's window and limits)."""
        title = f"Demo story, {policy} policy: {DEMO_CONVERSATION.name}"
        existing = AgentSession.objects.filter(owner=user, title=title).first()
        if existing is not None:
            return existing
        profile = AgentProfile.objects.filter(owner=user, name=f"demo-{policy}").first()
        if profile is None:
            profile = services.profile_create(owner=user, name=f"demo-{policy}",
                                              knobs={**DEMO_PROFILE, "policy": policy})
        return services.transcript_import(owner=user, path=DEMO_CONVERSATION, profile=profile, title=title)

    def _demo_user(self) -> User:
        user = User.objects.filter(username="demo").first()
        if user is None:
            user = User.objects.create_user("demo", password="demo")
            self.stdout.write("Created user 'demo' with password 'demo'.")
        else:
            self.stdout.write("User 'demo' exists (password 'demo' unless someone changed it).")
        return user

    def _warn_if_demo_login_left(self) -> None:
        # Earlier versions of the start script created it on any database.
        demo = User.objects.filter(username="demo").first()
        if demo is not None and demo.check_password("demo"):
            self.stderr.write(
                "Warning: this shared database has a user 'demo' with the password 'demo', which anyone can "
                "log in as. Change its password (python manage.py changepassword demo) or delete it.")


def embedded_database() -> bool:
    """Whether the database is SQLite: a file of this machine, not a database others share."""
    return connection.vendor == "sqlite"
