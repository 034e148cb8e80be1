from __future__ import annotations

import io

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db import connection

from contextlab.sessions.models import AgentSession
from tests.conversations import CORPUS, TAU_BENCH


def _run(**options):
    out = io.StringIO()
    call_command("loaddemo", stdout=out, **options)
    return out.getvalue()


@pytest.fixture
def embedded(db):
    # The suite runs once on SQLite and once on PostgreSQL (scripts/test.sh).
    if connection.vendor != "sqlite":
        pytest.skip("the demo login exists only on the embedded SQLite database")


@pytest.fixture
def shared(db):
    if connection.vendor == "sqlite":
        pytest.skip("runs on a shared database (the scaled-mode run of the suite, on PostgreSQL)")


def test_it_creates_the_demo_user_and_a_session_with_compactions(embedded, tmp_path):
    output = _run(corpus=str(tmp_path))  # an empty corpus: the shipped conversation is used
    assert "password 'demo'" in output
    user = User.objects.get(username="demo")
    assert user.check_password("demo")
    session = AgentSession.objects.get(owner=user, title="Demo: demo_conversation.json")
    assert session.profile.max_input_length == 4_000
    assert session.compactions_count >= 1
    assert session.status == "active"


def test_it_is_idempotent(embedded, tmp_path):
    _run(corpus=str(tmp_path))
    output = _run(corpus=str(tmp_path))
    assert "already there" in output
    assert User.objects.filter(username="demo").count() == 1
    # The demo session (the shipped conversation, contextlab policy) and the same conversation under copaw.
    assert sorted(AgentSession.objects.values_list("profile__policy", flat=True)) == ["contextlab", "copaw"]


@pytest.mark.skipif(not TAU_BENCH.exists(), reason="the shared corpus is not present")
def test_it_imports_the_tau_bench_transcript_when_the_corpus_is_there(embedded):
    _run(corpus=str(CORPUS))
    session = AgentSession.objects.get(title__startswith="Demo: ")
    assert session.source["format"] == "tau_bench"
    assert session.compactions_count >= 1


def test_it_gives_the_demo_session_to_an_existing_owner_without_creating_a_login(alice, tmp_path):
    output = _run(corpus=str(tmp_path), owner="alice")
    assert "log in as alice" in output
    assert not User.objects.filter(username="demo").exists()
    session = AgentSession.objects.get(title__startswith="Demo: ")
    assert session.owner == alice
    assert session.compactions_count >= 1
    assert "already there" in _run(corpus=str(tmp_path), owner="alice")


def test_it_refuses_an_owner_who_does_not_exist(db, tmp_path):
    with pytest.raises(CommandError, match="no user 'nobody'"):
        _run(corpus=str(tmp_path), owner="nobody")
    assert not User.objects.exists()
    assert not AgentSession.objects.exists()


def test_it_never_creates_the_demo_login_on_a_shared_database(shared, tmp_path):
    with pytest.raises(CommandError, match="never created on a shared database"):
        _run(corpus=str(tmp_path))
    assert not User.objects.filter(username="demo").exists()
    assert not AgentSession.objects.exists()


def test_it_warns_about_a_demo_login_an_earlier_start_left_on_a_shared_database(shared, alice, tmp_path):
    User.objects.create_user("demo", password="demo")
    errors = io.StringIO()
    call_command("loaddemo", corpus=str(tmp_path), owner="alice", stdout=io.StringIO(), stderr=errors)
    assert "user 'demo' with the password 'demo'" in errors.getvalue()
