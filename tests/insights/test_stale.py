"""Stale reads: reads of a file that a later call wrote."""

from __future__ import annotations

import pytest
from django.urls import reverse

from contextlab.sessions import services
from contextlab.sessions.models import SessionMessage
from tests.corpus import corpus_path
from tests.insights.conftest import XSS, call, result

SWE_AGENT = "swe-agent/replay__marshmallow-1867__function_calling_replace_from_source.traj"


def _url(session) -> str:
    return reverse("cl-insights-stale", args=[session.id])


@pytest.fixture
def edited_session(alice_session):
    """app.py read, then edited: the read is stale and still live."""
    services.messages_append(session=alice_session, messages=[
        {"role": "user", "content": "Rename the handler in app.py."},
        call("r1", "read_file", {"path": f"/srv/app{XSS}.py"}),
        result("r1", "def handler():\n    return 1\n"),
        call("w1", "write_file", {"path": f"/srv/app{XSS}.py", "content": "def main():\n    return 1\n"}),
        result("w1", "wrote 2 lines"),
    ])
    return alice_session


def test_it_flags_a_read_whose_file_was_written_later(alice_client, edited_session):
    html = alice_client.get(_url(edited_session)).content.decode()
    read = SessionMessage.objects.get(session=edited_session, seq=3)
    writer = SessionMessage.objects.get(session=edited_session, seq=4)
    assert reverse("cl-message-detail", args=[edited_session.id, read.seq]) in html
    assert reverse("cl-message-detail", args=[edited_session.id, writer.seq]) in html
    assert "live: the model sees an old version" in html
    assert "read_file" in html and "write_file" in html


def test_paths_are_escaped(alice_client, edited_session):
    html = alice_client.get(_url(edited_session)).content.decode()
    assert XSS not in html
    assert "/srv/app&lt;script&gt;" in html


def test_a_session_without_writes_has_none(alice_client, tool_session):
    html = alice_client.get(_url(tool_session)).content.decode()
    assert "No stale read" in html


def test_another_user_gets_a_404(bob_client, edited_session):
    assert bob_client.get(_url(edited_session)).status_code == 404


@pytest.mark.corpus
def test_it_shows_the_stale_reads_of_the_swe_agent_transcript(alice, alice_client):
    session = services.transcript_import(owner=alice, path=corpus_path(SWE_AGENT))
    html = alice_client.get(_url(session)).content.decode()
    assert "src/marshmallow/fields.py" in html
    assert "No stale read" not in html
