"""The profile page's what-if, its history and version pages, and the search's re-inject action (Django client)."""

from __future__ import annotations

from django.urls import reverse

from contextlab.dashboard.forms import KNOBS
from contextlab.sessions import services
from contextlab.sessions.models import SessionMessage, WhatIfRun
from tests.dashboard.conftest import work


def _form_data(profile, **changes) -> dict[str, object]:
    data: dict[str, object] = {"name": profile.name}
    for name in KNOBS:
        value = getattr(profile, name)
        data[name] = ", ".join(value) if isinstance(value, list) else value
    return {**data, **changes}


def test_it_starts_a_what_if_of_the_unsaved_values_and_shows_its_result(alice_client, alice_session):
    work(alice_session, 6)
    profile = alice_session.profile
    url = reverse("cl-profile-what-if", args=[profile.pk])
    with_session = _form_data(profile, max_input_length=2_500, what_if_session=str(alice_session.id))
    response = alice_client.post(url, with_session)
    assert response.status_code == 200
    run = WhatIfRun.objects.get()
    assert run.values["max_input_length"] == 2_500
    profile.refresh_from_db()
    assert profile.max_input_length == 4_000 and profile.version == 1
    services.whatif_execute(run.pk)
    page = alice_client.get(reverse("cl-profile-what-if-run", args=[profile.pk, run.pk])).content.decode()
    assert 'data-status="done"' in page and 'data-k="what-if-compactions"' in page
    assert "extractive compactor" in page


def test_it_refuses_a_what_if_of_invalid_values(alice_client, alice_session):
    work(alice_session, 1)
    data = _form_data(alice_session.profile, compact_ratio=5, what_if_session=str(alice_session.id))
    page = alice_client.post(reverse("cl-profile-what-if", args=[alice_session.profile_id]), data).content.decode()
    assert "Fix the fields" in page and not WhatIfRun.objects.exists()


def test_a_form_save_is_a_version_listed_with_old_and_new_values(alice, alice_client, small_profile):
    url = reverse("cl-profile-edit", args=[small_profile.pk])
    assert alice_client.post(url, _form_data(small_profile, recent_n=5)).status_code == 302
    page = alice_client.get(url).content.decode()
    assert 'data-version="2"' in page and "recent_n" in page and "<del>2</del> → <ins>5</ins>" in page
    version = alice_client.get(reverse("cl-profile-version", args=[small_profile.pk, 2])).content.decode()
    assert "Version 2" in version and "via form" in version and "alice" in version


def test_another_users_profile_history_is_a_404(bob_client, small_profile):
    assert bob_client.get(reverse("cl-profile-version", args=[small_profile.pk, 1])).status_code == 404


def test_the_turn_list_and_turn_page_show_the_profile_version(alice_client, alice_session):
    work(alice_session, 1)
    turn_page = alice_client.get(reverse("cl-turn-detail", args=[alice_session.id, 1])).content.decode()
    assert 'data-profile-version="1"' in turn_page
    assert reverse("cl-profile-version", args=[alice_session.profile_id, 1]) in turn_page


def test_the_search_offers_to_reinject_and_the_action_does_it(alice_client, alice_session):
    work(alice_session, 12)
    row = SessionMessage.objects.filter(session=alice_session, status="archived").order_by("seq").first()
    assert row is not None
    page = alice_client.get(reverse("cl-session-search", args=[alice_session.id]), {"q": "/srv/app/t1.log"})
    assert 'id="reinject-button"' in page.content.decode()
    response = alice_client.post(reverse("cl-message-reinject", args=[alice_session.id, row.seq]),
                                 headers={"HX-Request": "true"})
    assert "re-injected" in response.content.decode()
    assert SessionMessage.objects.filter(session=alice_session, fate__0__reinjected_from=row.message_id).exists()
