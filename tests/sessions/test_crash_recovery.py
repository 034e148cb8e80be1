"""A process killed in the middle of a turn loses nothing and duplicates nothing (spec §4).

The turn runs in a child process against a real database (a SQLite file, and
PostgreSQL when the suite runs on it) and a real workspace; the child dies with
``os._exit`` at the worst moments, so no ``finally`` and no rollback handler of
ours runs, exactly like a killed worker:

* right after the dialog archive was written, before the database commit: the
  database rolls the turn back, so its archive lines must be cut back on the
  next load, or the retried turn archives the same messages a second time;
* right after the database commit, before the archive journal was cleared: the
  turn was saved, so nothing may be undone.

A fresh process then runs the hook again normally, and everything stored is
checked against everything sent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from django.conf import settings

REPO = Path(__file__).resolve().parents[2]

# The child: ``python child.py MODE [SESSION_ID]``; every mode prints JSON lines.
CHILD = textwrap.dedent('''
    from __future__ import annotations

    import json
    import logging
    import os
    import sys

    import django

    django.setup()

    from django.contrib.auth.models import User
    from django.core.management import call_command

    from contextlab.engine.stages.archive import DialogArchive
    from contextlab.engine.hook import ContextManager
    from contextlab.sessions import services
    from contextlab.sessions.models import AgentSession, SessionMessage, SummaryVersion, Turn
    from contextlab.sessions.services.persistence import stored_live_ids
    from tests.conversations import answer, tool_turn

    KILLED = 137


    def say(**data):
        print(json.dumps(data), flush=True)


    def next_step(session):
        return SessionMessage.objects.filter(session=session, role="user").count() + 1


    def step(session, i):
        """One agent step: the answer to the last one, a new tool exchange, then the hook."""
        batch = [*([answer(i - 1)] if i > 1 else []), *tool_turn(i, output_bytes=1_200)]
        services.messages_append(session=session, messages=batch)
        say(appended=len(batch))  # committed: these messages must survive whatever follows
        services.session_prepare(session=session)


    def dump(session):
        session.refresh_from_db()
        state = session.engine_state
        say(dump={
            "workspace": str(session.workspace),
            "turns_count": session.turns_count,
            "messages_count": session.messages_count,
            "live_count": session.live_count,
            "summary_version": session.summary_version,
            "state_turn": state["turn"],
            "state_live_ids": stored_live_ids(session),
            "state_archived_ids": list(SessionMessage.objects.filter(session=session, status="archived")
                                       .order_by("seq").values_list("message_id", flat=True)),
            "state_summary_versions": [s["version"] for s in state["summaries"]],
            "turns": list(Turn.objects.filter(session=session).order_by("number").values_list("number", flat=True)),
            "summary_versions": list(SummaryVersion.objects.filter(session=session).order_by("version")
                                     .values_list("version", flat=True)),
            "rows": [{"id": r.message_id, "seq": r.seq, "status": r.status, "content": r.content,
                      "archive_file": r.archive_file, "archive_line": r.archive_line,
                      "compacted_turn": r.compacted_turn}
                     for r in SessionMessage.objects.filter(session=session).order_by("seq")],
        })


    def crash_after_archive_write():
        real = DialogArchive.append

        def append(self, records, **kwargs):
            real(self, records, **kwargs)
            say(killed="after the archive write", turn=records[0][1]["archived_turn"])
            os._exit(KILLED)

        DialogArchive.append = append


    def crash_after_database_commit():
        real = ContextManager.commit

        def commit(self):
            # Every save commits; only one with archive lines to clear is the moment.
            if self.archive.journal_path.exists():
                say(killed="after the database commit", turn=self.turn)
                os._exit(KILLED)
            real(self)

        ContextManager.commit = commit


    mode = sys.argv[1]
    if mode == "setup":
        call_command("migrate", interactive=False, verbosity=0)
        owner = User.objects.create_user("crash-owner")
        profile = services.profile_create(owner=owner, name="small", knobs={
            "max_input_length": 4_000, "recent_n": 2, "recent_max_bytes": 1_500, "old_max_bytes": 400})
        session = services.session_create(owner=owner, system_prompt="You are a careful coding agent.",
                                          profile=profile)
        say(session=str(session.pk))
        step(session, 1)
    else:
        session = AgentSession.objects.get(pk=sys.argv[2])
        if mode == "dump":
            dump(session)
        elif mode in ("crash-archive", "crash-commit"):
            (crash_after_archive_write if mode == "crash-archive" else crash_after_database_commit)()
            start = next_step(session)
            for i in range(start, start + 12):  # the window is small: a compaction comes soon
                step(session, i)
            say(error="no compaction happened, so nothing was killed")
            sys.exit(3)
        elif mode == "restart":
            warnings = []

            class Keep(logging.Handler):
                def emit(self, record):
                    warnings.append(record.getMessage())

            logging.getLogger("contextlab.sessions.services").addHandler(Keep(logging.WARNING))
            session_pk = session.pk
            # The agent retries its hook call, then goes on for two more steps.
            services.session_prepare(session=session)
            start = next_step(session)
            for i in range(start, start + 2):
                step(session, i)
            say(warnings=warnings)
            dump(AgentSession.objects.get(pk=session_pk))
''')


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """A real database for the children, migrated by the first child."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'crash.sqlite3'}"
        return
    parent = settings.DATABASES["default"]
    if parent["ENGINE"] != "django.db.backends.postgresql":
        pytest.skip("the suite runs on SQLite (set DATABASE_URL to a PostgreSQL database)")
    import psycopg

    # A database of its own: the children commit for real, which the suite's
    # test database (one transaction per test) must not see.
    name = f"{parent['NAME']}_crash_{uuid.uuid4().hex[:10]}"
    params: dict[str, Any] = {"host": parent.get("HOST") or None, "port": parent.get("PORT") or None,
                              "user": parent.get("USER") or None, "password": parent.get("PASSWORD") or None}
    try:
        with psycopg.connect(dbname="postgres", autocommit=True, **params) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
    except psycopg.errors.InsufficientPrivilege:
        pytest.skip("the PostgreSQL user may not create a database")
    user = quote(parent.get("USER") or "", safe="")
    password = f":{quote(parent['PASSWORD'], safe='')}" if parent.get("PASSWORD") else ""
    yield f"postgres://{user}{password}@{parent.get('HOST') or 'localhost'}:{parent.get('PORT') or 5432}/{name}"
    with psycopg.connect(dbname="postgres", autocommit=True, **params) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Child:
    """Runs the child script against one database and one workspaces folder."""

    def __init__(self, tmp_path: Path, database_url: str) -> None:
        self.script = tmp_path / "crash_child.py"
        self.script.write_text(CHILD, encoding="utf-8")
        self.env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DJANGO_SETTINGS_MODULE")}
        self.env.update({
            "DJANGO_SETTINGS_MODULE": "contextlab.settings",
            "DATABASE_URL": database_url,
            "CONTEXTLAB_WORKSPACES_DIR": str(tmp_path / "workspaces"),
            "PYTHONPATH": os.pathsep.join([str(REPO), self.env.get("PYTHONPATH", "")]),
        })
        self.sent = 0  # messages whose append committed, over every child

    def run(self, *args: str, expect: int = 0) -> list[dict[str, Any]]:
        done = subprocess.run([sys.executable, str(self.script), *args], cwd=REPO, env=self.env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == expect, f"child {args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        self.sent += sum(line.get("appended", 0) for line in lines)
        return lines


def _one(lines: list[dict[str, Any]], key: str) -> Any:
    found = [line[key] for line in lines if key in line]
    assert len(found) == 1, lines
    return found[0]


def _archive(workspace: Path) -> list[tuple[str, int, dict[str, Any]]]:
    """Every line of the dialog archive: (file, line number, record)."""
    out = []
    for path in sorted((workspace / "dialog").glob("*.jsonl")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            out.append((f"dialog/{path.name}", number, json.loads(line)))
    return out


def _assert_consistent(dump: dict[str, Any], sent: int) -> None:
    """What the database says, what the engine state says and what the archive holds agree."""
    workspace = Path(dump["workspace"])
    rows = dump["rows"]
    # No message lost at ingest, none recorded twice.
    assert len(rows) == sent == dump["messages_count"]
    assert len({r["id"] for r in rows}) == len(rows)
    assert [r["seq"] for r in rows] == list(range(1, len(rows) + 1))
    live = [r["id"] for r in rows if r["status"] == "live"]
    archived = {r["id"]: r for r in rows if r["status"] == "archived"}
    assert len(live) + len(archived) == len(rows)
    # Every archived message is in the archive exactly once, as it was ingested.
    lines = _archive(workspace)
    ids = [record["id"] for _, _, record in lines]
    assert len(ids) == len(set(ids)), "a message was archived twice"
    assert set(ids) == set(archived), "the archive and the database disagree on what was compacted"
    where = {(file, number): record for file, number, record in lines}
    for mid, row in archived.items():
        record = where[(row["archive_file"], row["archive_line"])]
        assert record["id"] == mid
        assert record["content"] == row["content"]
        assert record["archived_turn"] == row["compacted_turn"]
    # The engine state is the one the rows were written from.
    assert dump["state_live_ids"] == live
    assert dump["live_count"] == len(live)
    assert sorted(dump["state_archived_ids"]) == sorted(archived)
    # Turns are numbered 1..n with no gap and no repeat, like the summaries.
    assert dump["turns"] == list(range(1, dump["turns_count"] + 1))
    assert dump["state_turn"] == dump["turns_count"]
    assert dump["summary_versions"] == dump["state_summary_versions"] == list(range(1, dump["summary_version"] + 1))
    assert not (workspace / "dialog" / ".uncommitted.json").exists()


def test_it_undoes_the_archive_write_of_a_turn_killed_before_its_commit(tmp_path: Path, database_url: str) -> None:
    child = Child(tmp_path, database_url)
    session = _one(child.run("setup"), "session")
    killed = child.run("crash-archive", session, expect=137)
    crashed_turn = _one(killed, "turn")

    before = _one(child.run("dump", session), "dump")
    # The database never got the turn...
    assert before["turns"] == list(range(1, crashed_turn))
    assert before["state_turn"] == crashed_turn - 1
    # ...but the archive did: lines no row points to, and the journal to undo them.
    workspace = Path(before["workspace"])
    stored = {r["id"] for r in before["rows"] if r["status"] == "archived"}
    orphans = [record["id"] for _, _, record in _archive(workspace) if record["id"] not in stored]
    assert orphans
    journal = json.loads((workspace / "dialog" / ".uncommitted.json").read_text(encoding="utf-8"))
    assert journal["turn"] == crashed_turn

    restarted = child.run("restart", session)
    after = _one(restarted, "dump")
    assert any("cut dialog/" in w and f"before turn {crashed_turn}" in w for w in _one(restarted, "warnings"))
    _assert_consistent(after, child.sent)
    # The retried turn compacted the messages the killed one had archived, once each.
    assert set(orphans) <= set(after["state_archived_ids"])
    assert after["turns_count"] == crashed_turn + 2


def test_it_keeps_the_archive_write_of_a_turn_killed_after_its_commit(tmp_path: Path, database_url: str) -> None:
    child = Child(tmp_path, database_url)
    session = _one(child.run("setup"), "session")
    killed = child.run("crash-commit", session, expect=137)
    committed_turn = _one(killed, "turn")

    before = _one(child.run("dump", session), "dump")
    workspace = Path(before["workspace"])
    # The turn was saved; its archive lines are referenced, only the journal is left.
    assert before["turns"] == list(range(1, committed_turn + 1))
    assert (workspace / "dialog" / ".uncommitted.json").exists()
    archive_before = {p.name: p.read_bytes() for p in (workspace / "dialog").glob("*.jsonl")}
    assert archive_before
    assert {record["id"] for _, _, record in _archive(workspace)} == set(before["state_archived_ids"])

    restarted = child.run("restart", session)
    after = _one(restarted, "dump")
    assert _one(restarted, "warnings") == []  # nothing to undo
    _assert_consistent(after, child.sent)
    for name, data in archive_before.items():
        assert (workspace / "dialog" / name).read_bytes().startswith(data), "a saved turn's archive lines were undone"
    assert set(before["state_archived_ids"]) <= set(after["state_archived_ids"])
    assert after["turns_count"] == committed_turn + 3
