"""Manual compaction from the session page: preview, start in the background, one at a time."""

from __future__ import annotations

from contextlab.sessions import services
from contextlab.sessions.models import CompactionRun
from tests.conversations import tool_turn
from tests.dashboard.conftest import work


def _url(session, rest):
    return f"{session.get_absolute_url()}{rest}"


def test_it_previews_the_split(alice_client, worked_session):
    preview = services.compaction_preview(session=worked_session)
    page = alice_client.get(_url(worked_session, "compaction/preview/")).content.decode()
    assert f"{len(preview['compact_ids']):,} message" in page
    assert f"{preview['kept_tokens']:,} tokens" in page
    assert "Would be compacted" in page and "Would be kept" in page


def test_it_starts_a_run_in_the_background_and_disables_the_button(alice_client, compactable_session,
                                                                   django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks:
        response = alice_client.post(_url(compactable_session, "compaction/"), {"instruction": "keep every path"},
                                     headers={"HX-Request": "true"})
    assert response.status_code == 202
    run = CompactionRun.objects.get(session=compactable_session)
    assert run.status == "queued" and run.instruction == "keep every path"
    assert callbacks, "the job is handed to the job runner after the commit"
    page = response.content.decode()
    assert page.lstrip().startswith('<div id="compaction"')
    assert 'id="compact-button" disabled' in page
    assert f'data-run="{run.pk}" data-status="queued"' in page


def test_it_works_without_javascript_too(alice_client, compactable_session):
    response = alice_client.post(_url(compactable_session, "compaction/"), {"instruction": ""})
    assert response.status_code == 302
    assert response["Location"] == f"{compactable_session.get_absolute_url()}#compaction-card"
    assert CompactionRun.objects.filter(session=compactable_session, status="queued").exists()


def test_it_refuses_a_second_run_while_one_is_queued(alice_client, compactable_session):
    alice_client.post(_url(compactable_session, "compaction/"))
    response = alice_client.post(_url(compactable_session, "compaction/"), headers={"HX-Request": "true"})
    assert response.status_code == 409
    assert "wait for it to finish" in response.content.decode()
    assert CompactionRun.objects.filter(session=compactable_session).count() == 1


def test_it_shows_the_result_once_the_run_is_done(alice_client, compactable_session):
    worked_session = compactable_session
    alice_client.post(_url(worked_session, "compaction/"))
    run = CompactionRun.objects.get(session=worked_session)
    assert services.compaction_work(run_id=run.pk) == "done"
    run.refresh_from_db()
    page = alice_client.get(worked_session.get_absolute_url()).content.decode()
    panel = page[page.index('<div id="compaction"'):page.index('id="compaction-preview"')]
    assert f'data-run="{run.pk}" data-status="done"' in panel
    assert f"turns/{run.turn_number}/" in panel
    # Everything before the newest request is in the summary now: nothing is left to compact.
    assert 'id="compact-button" disabled' in panel and "nothing to compact" in panel
    # The manual turn is a turn like the others, with its flow.
    assert 'data-outcome="compacted"' in alice_client.get(
        _url(worked_session, f"inspect/?turn={run.turn_number}")).content.decode()


def test_it_refuses_a_session_being_imported(alice_client, worked_session):
    worked_session.status = "importing"
    worked_session.save(update_fields=["status"])
    response = alice_client.post(_url(worked_session, "compaction/"))
    assert response.status_code == 409
    assert "still being imported" in response.content.decode()


def test_it_refuses_when_nothing_can_be_compacted_and_says_why(alice_client, alice_session):
    # Nineteen turns of the worked session's size: the nineteenth just compacted, so every live
    # message is in the kept tail.
    work(alice_session, 19, output_bytes=2_000)
    worked_session = alice_session
    assert worked_session.turns.order_by("-number").first().outcome == "compacted"
    assert services.compaction_preview(session=worked_session)["compact_ids"] == []
    turns = worked_session.turns_count
    page = alice_client.get(worked_session.get_absolute_url()).content.decode()
    assert 'id="compact-button" disabled' in page
    assert "nothing to compact" in page
    response = alice_client.post(_url(worked_session, "compaction/"), headers={"HX-Request": "true"})
    assert response.status_code == 409
    assert "nothing to compact" in response.content.decode()
    worked_session.refresh_from_db()
    assert worked_session.turns_count == turns
    assert not CompactionRun.objects.filter(session=worked_session).exists()


def test_it_shows_why_a_run_had_nothing_to_compact(alice_client, alice_session):
    services.messages_append(session=alice_session, messages=tool_turn(1, output_bytes=200))
    # The page refuses it (409, above); a run queued another way, e.g. through the API, says why.
    run = services.compaction_enqueue(session=alice_session)
    assert services.compaction_work(run_id=run.pk) == "done"
    run.refresh_from_db()
    assert run.outcome == "nothing_to_compact" and "newest request" in run.error
    page = alice_client.get(alice_session.get_absolute_url()).content.decode()
    panel = page[page.index('<div id="compaction"'):page.index('id="compaction-preview"')]
    assert 'class="muted run-reason small"' in panel
    assert "the newest request, which is never compacted" in panel
