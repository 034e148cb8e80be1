from __future__ import annotations

import io

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from contextlab.sessions.models import AgentSession
from tests.conversations import CORPUS, TAU_BENCH


def _run(**options):
    out = io.StringIO()
    call_command("loaddemo", stdout=out, **options)
    return out.getvalue()


def test_it_creates_the_demo_user_and_a_session_with_compactions(db, tmp_path):
    output = _run(corpus=str(tmp_path))  # an empty corpus: the shipped conversation is used
    assert "password 'demo'" in output
    user = User.objects.get(username="demo")
    assert user.check_password("demo")
    session = AgentSession.objects.get(owner=user)
    assert session.profile.max_input_length == 4_000
    assert session.compactions_count >= 1
    assert session.status == "active"


def test_it_is_idempotent(db, tmp_path):
    _run(corpus=str(tmp_path))
    output = _run(corpus=str(tmp_path))
    assert "already there" in output
    assert User.objects.filter(username="demo").count() == 1
    assert AgentSession.objects.count() == 1


@pytest.mark.skipif(not TAU_BENCH.exists(), reason="the shared corpus is not present")
def test_it_imports_the_tau_bench_transcript_when_the_corpus_is_there(db):
    _run(corpus=str(CORPUS))
    session = AgentSession.objects.get()
    assert session.source["format"] == "tau_bench"
    assert session.compactions_count >= 1
