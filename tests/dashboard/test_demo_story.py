"""The demo's story on the landing page: found by the session search at load time, told as the search tells it."""

from __future__ import annotations

import html
import io
import re

import pytest
from django.core.management import call_command
from django.test import Client

from contextlab.dashboard import demo_story
from contextlab.dashboard.search import search_session
from contextlab.sessions import services
from contextlab.sessions.models import AgentSession, SummaryVersion
from tests.conversations import CORPUS, TAU_BENCH
from tests.dashboard.conftest import work


def _plain(page: bytes) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page.decode()))


def _one_click(client: Client, story: dict, session: AgentSession) -> str:
    """The landing page's button, followed: the search page's answer, as text."""
    landing = client.get("/").content.decode()
    link = f"{session.get_absolute_url()}search?q={story['needle']}"
    assert f'href="{html.escape(link)}"' in landing or f'href="{link}"' in landing
    return _plain(client.get(link).content)


@pytest.mark.parametrize("transcript", ["shipped", "corpus"])
def test_it_tells_the_demo_s_story_as_the_search_answers_it_one_click_from_the_landing_page(
        alice, tmp_path, transcript):
    corpus = str(tmp_path)  # empty: the shipped conversation
    if transcript == "corpus":
        if not (CORPUS / TAU_BENCH).is_file():
            pytest.skip("the shared corpus is not here")
        corpus = str(CORPUS)
    call_command("loaddemo", corpus=corpus, owner="alice", stdout=io.StringIO())
    session = AgentSession.objects.get(owner=alice, title__startswith="Demo: ")
    story = session.source["demo_story"]
    assert story, "a demo with compactions has a story"
    client = Client()
    client.force_login(alice)
    landing = _plain(client.get("/").content)
    assert "New here? What the demo shows" in landing
    # The card tells one story, the loss under the copaw policy (the next test follows it); the
    # demo session's own story, kept with it, is what the search of that session answers.
    assert story["loss"]["needle"] in landing
    answer = _plain(client.get(f"{session.get_absolute_url()}search", {"q": story["needle"]}).content)
    version = f"summary v{story['version']}"
    assert f"compacted in turn {story['turn']}" in answer and version in answer
    if story["kind"] == "lost":
        assert f"{version}, which did not keep it" in answer
        assert story["needle"] not in SummaryVersion.objects.filter(session=session).order_by("-version").first().text
    else:
        assert f"{version}, which kept it" in answer


def test_it_tells_of_the_user_s_planted_code_what_the_search_says(alice, small_profile):
    """A code the user gave in passing, then enough work that its message is compacted."""
    session = services.session_create(owner=alice, system_prompt="You are a careful coding agent.",
                                      profile=small_profile, title="planted")
    services.messages_append(session=session, messages=[
        {"role": "user", "content": "Before you start: the customer's booking reference is QX7RT2, keep it in mind."}])
    work(session, 14)
    message = session.messages.get(seq=1)
    assert message.compacted_turn is not None
    story = demo_story.find_story(session)
    assert story is not None and story["needle"] == "QX7RT2" and story["seq"] == 1 and story["role"] == "user"
    assert story["turn"] == message.compacted_turn and story["version"] == message.summary_version
    result = search_session(session, "QX7RT2")
    kept = {s["version"]: s["contains"] for s in result.summaries}[story["version"]]
    assert story["kind"] == ("kept" if kept else "lost")


def test_it_links_lost_identifiers_to_the_version_that_lost_them_first(alice_client, worked_session):
    losses = SummaryVersion.objects.filter(session=worked_session, lost_count__gt=0).order_by("version")
    if not losses.exists():
        pytest.skip("no identifier lost in this session with the current loss check")
    page = alice_client.get("/").content.decode()
    assert f"summaries/?v={losses.first().version}#lost-at-compaction" in page


def test_it_says_on_the_turn_page_that_its_compaction_lost_identifiers(alice_client, worked_session):
    losses = SummaryVersion.objects.filter(session=worked_session, lost_count__gt=0).order_by("version")
    if not losses.exists():
        pytest.skip("no identifier lost in this session with the current loss check")
    version = losses.first()
    page = alice_client.get(f"{worked_session.get_absolute_url()}turns/{version.turn}/").content.decode()
    assert 'id="turn-loss"' in page
    assert f"summaries/?v={version.version}#lost-at-compaction" in page
    assert f"{version.lost_count} lost" in page
    quiet = worked_session.turns.exclude(number=version.turn).filter(outcome="no_action").first()
    assert 'id="turn-loss"' not in alice_client.get(f"{worked_session.get_absolute_url()}turns/{quiet.number}/").content.decode()


def test_it_leads_from_the_landing_page_to_a_real_loss_that_the_contextlab_policy_avoids(alice, tmp_path):
    """The shipped conversation under CoPaw's own policy loses the user's audit ticket (the loss check
    finds it); the same conversation under contextlab keeps it; the landing page's button opens the loss."""
    call_command("loaddemo", corpus=str(tmp_path), owner="alice", stdout=io.StringIO())
    home = AgentSession.objects.get(owner=alice, title="Demo: demo_conversation.json")
    copaw = AgentSession.objects.get(owner=alice, profile__policy="copaw")
    loss = home.source["demo_story"]["loss"]
    assert loss["needle"] == "AUD-5530" and loss["role"] == "user" and loss["session"] == str(copaw.pk)
    # The loss is real: the message was compacted, and the loss check of that version lists the ticket.
    message = copaw.messages.get(seq=loss["seq"])
    assert "AUD-5530" in str(message.content) and message.summary_version == loss["version"]
    version = SummaryVersion.objects.get(session=copaw, version=loss["version"])
    assert "AUD-5530" in {item["value"] for item in version.lost_at_compaction}
    assert all("AUD-5530" not in v.text for v in SummaryVersion.objects.filter(session=copaw))
    # The contextlab session of the same conversation compacted the same message and kept the ticket.
    fate = loss["compare"]["fate"]
    assert loss["compare"]["session"] == str(home.pk) and fate["kept"]
    kept = {s["version"]: s["contains"] for s in search_session(home, "AUD-5530").summaries}
    assert kept[fate["version"]]
    # One click from the landing page: the search of the copaw session says where it went.
    client = Client()
    client.force_login(alice)
    landing = _plain(client.get("/").content)
    assert "A real loss" in landing and "AUD-5530" in landing and f"summary v{fate['version']}" in landing
    answer = _one_click(client, loss, copaw)
    assert f"compacted in turn {loss['turn']}" in answer
    assert f"summary v{loss['version']}, which did not keep it" in answer
