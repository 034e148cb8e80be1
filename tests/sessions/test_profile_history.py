"""Profile history: every change is a version (who, when, what), and each turn records the version it ran under."""

from __future__ import annotations

from contextlab.sessions import services
from contextlab.sessions.models import ProfileVersion, Turn
from tests.dashboard.conftest import work


def test_it_records_the_creation_as_version_one(alice):
    profile = services.profile_create(owner=alice, name="p", knobs={"max_input_length": 8_000})
    (first,) = profile.versions.all()
    assert (first.number, first.changes, first.values["max_input_length"]) == (1, [], 8_000)


def test_it_records_each_change_with_old_and_new_values_and_who(alice, small_profile):
    small_profile.compact_ratio = 0.6
    small_profile.recent_n = 3
    small_profile.save(changed_by=alice, change_source="form")
    small_profile.save()  # nothing changed: no version
    assert small_profile.version == 2
    latest = small_profile.versions.first()
    assert latest is not None
    assert (latest.number, latest.changed_by, latest.source) == (2, alice, "form")
    assert latest.changes == [{"field": "compact_ratio", "old": 0.7, "new": 0.6},
                              {"field": "recent_n", "old": 2, "new": 3}]
    assert ProfileVersion.objects.filter(profile=small_profile).count() == 2


def test_each_turn_records_the_profile_version_it_ran_under(alice_session):
    work(alice_session, 2)
    profile = alice_session.profile
    profile.recent_n = 3
    profile.save()
    work(alice_session, 1, first=3)
    versions = dict(Turn.objects.filter(session=alice_session).values_list("number", "profile_version"))
    assert versions == {1: 1, 2: 1, 3: 2}
    assert Turn.objects.get(session=alice_session, number=3).to_dict()["profile_version"] == 2


def test_a_profile_made_through_the_api_says_so_in_its_history(api, alice):
    response = api.post("/api/v1/profiles", {"name": "from-api", "max_input_length": 9_000})
    assert response.status_code == 201, response.content
    version = ProfileVersion.objects.get(profile_id=response.json()["id"])
    assert (version.number, version.source, version.changed_by) == (1, "api", alice)
