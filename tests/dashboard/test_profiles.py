"""Profiles in the browser: every knob with its bounds, errors on the field, a live preview."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.test import Client

from contextlab.dashboard.forms import KNOBS
from contextlab.engine.core.profile import BOUNDS, Profile
from contextlab.sessions.models import PROFILE_KNOBS, AgentProfile


def _data(**overrides):
    profile = Profile()
    data = {"name": "tuned"}
    for name in KNOBS:
        value = getattr(profile, name, "")
        data[name] = ", ".join(value) if isinstance(value, tuple) else value
    data.update(overrides)
    return data


def test_it_lists_profiles_with_their_derived_numbers(alice_client, small_profile):
    page = alice_client.get("/profiles/").content.decode()
    assert "small" in page and f"{small_profile.threshold:,}" in page and f"{small_profile.reserve:,}" in page


def test_it_has_a_field_for_every_knob_with_its_bounds(alice_client):
    page = alice_client.get("/profiles/new/").content.decode()
    assert set(KNOBS) == set(PROFILE_KNOBS) & set(KNOBS)
    for name in KNOBS:
        assert f'name="{name}"' in page, name
    low, high = BOUNDS["max_input_length"].low, BOUNDS["max_input_length"].high
    assert f'min="{int(low)}"' in page and f'max="{int(high)}"' in page


def test_it_creates_a_profile(alice, alice_client):
    response = alice_client.post("/profiles/new/", _data(max_input_length=32_000, exempt_tool_names="grep, ls\nfind"))
    assert response.status_code == 302
    profile = AgentProfile.objects.get(owner=alice, name="tuned")
    assert profile.max_input_length == 32_000
    assert profile.exempt_tool_names == ["grep", "ls", "find"]


def test_it_shows_reserve_over_threshold_on_the_reserve_field(alice_client):
    response = alice_client.post("/profiles/new/", _data(compact_ratio=0.3, reserve_ratio=0.3))
    assert response.status_code == 200
    page = response.content.decode()
    field = page[page.index('data-field="reserve_ratio"'):]
    field = field[:field.index("</div>\n        </div>") if "</div>\n        </div>" in field else 2_000]
    assert "must be smaller than the compaction threshold" in field
    assert not AgentProfile.objects.filter(name="tuned").exists()


def test_it_shows_a_bound_error_on_its_field(alice_client):
    page = alice_client.post("/profiles/new/", _data(recent_n=0)).content.decode()
    errors = page[page.index('id="err-recent_n"'):]
    assert "recent_n must be a whole number from 1 to 100" in errors[:300]


def test_it_refuses_a_name_the_owner_already_uses(alice_client, small_profile):
    page = alice_client.post("/profiles/new/", _data(name="small")).content.decode()
    assert "you already have a profile named" in page


def test_it_previews_the_derived_numbers_as_the_knobs_change(alice_client):
    response = alice_client.post("/profiles/preview/", _data(max_input_length=10_000, compact_ratio=0.5,
                                                             reserve_ratio=0.1), headers={"HX-Request": "true"})
    page = response.content.decode()
    assert page.lstrip().startswith('<aside id="preview"')
    assert 'data-k="threshold">5,000<' in page and 'data-k="reserve">1,000<' in page
    bad = alice_client.post("/profiles/preview/", _data(max_input_length=10_000, compact_ratio=0.2,
                                                        reserve_ratio=0.3)).content.decode()
    assert 'id="err-reserve_ratio" role="alert" hx-swap-oob="true"><span>the reserve (3,000 tokens)' in bad


def test_it_edits_only_the_owners_profiles(alice_client, small_profile, bob):
    response = alice_client.post(f"/profiles/{small_profile.pk}/", _data(name="small", max_input_length=8_000))
    assert response.status_code == 302
    small_profile.refresh_from_db()
    assert small_profile.max_input_length == 8_000
    bob_client = Client()
    bob_client.force_login(bob)
    assert bob_client.get(f"/profiles/{small_profile.pk}/").status_code == 404


def test_the_admin_validates_the_same_way(db, alice):
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.org", "pw"))
    data = _data(owner=alice.pk, compact_ratio=0.3, reserve_ratio=0.3, exempt_tool_names="[]",
                 browser_tool_names="[]", read_file_tool_names="[]", created_0="2026-01-01", created_1="00:00:00")
    page = client.post("/admin/contextlab_sessions/agentprofile/add/", data).content.decode()
    row = page[page.index("field-reserve_ratio"):]
    assert "must be smaller than the compaction threshold" in row[:1_500]
