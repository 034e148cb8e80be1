"""Profile validation in the dashboard's form and the admin: one message per field, with the real
bound and why, every problem at once."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from contextlab.dashboard.forms import ProfileForm
from tests.dashboard.test_profiles import _data


def _errors(alice, **overrides) -> dict[str, list[str]]:
    form = ProfileForm(_data(**overrides), owner=alice)
    assert not form.is_valid()
    return {name: list(messages) for name, messages in form.errors.items()}


@pytest.mark.parametrize("value", [-5, 0, 101])
def test_it_states_the_same_bound_for_every_wrong_recent_n(alice, value):
    errors = _errors(alice, recent_n=value)
    assert len(errors["recent_n"]) == 1
    message = errors["recent_n"][0]
    assert message.startswith("recent_n must be a whole number from 1 to 100 (the newest N tool results")
    assert "0" not in message.split("(")[0].replace("100", "")  # never "≥ 0"


def test_it_says_an_out_of_bounds_ratio_once(alice):
    assert _errors(alice, compact_ratio=1.5) == {
        "compact_ratio": ["compact_ratio must be a number from 0.1 to 0.95 (compaction threshold as a share of "
                          "the window); 1.5 is above that"]}


def test_it_says_why_a_reserve_ratio_is_refused(alice):
    [message] = _errors(alice, reserve_ratio=0.8)["reserve_ratio"]
    assert "from 0.01 to 0.5" in message and "tokens kept from the tail" in message and "0.8 is above" in message


def test_it_reports_every_problem_at_once(alice):
    errors = _errors(alice, compact_ratio=0.3, reserve_ratio=0.3, old_max_bytes=60_000, recent_n=0,
                     eviction_weight_relevance=1.0, eviction_weight_recency=0.8, eviction_weight_density=0.4)
    assert set(errors) == {"reserve_ratio", "old_max_bytes", "recent_n", "eviction_weight_relevance"}
    assert all(len(messages) == 1 for messages in errors.values())
    assert "must be smaller than the compaction threshold" in errors["reserve_ratio"][0]
    assert "stage 2 only ever cuts further" in errors["old_max_bytes"][0]


def test_it_refuses_eviction_weights_that_do_not_add_up_to_one(alice):
    [message] = _errors(alice, eviction_weight_relevance=1.0, eviction_weight_recency=0.8,
                        eviction_weight_density=0.4)["eviction_weight_relevance"]
    assert "add up to 2.2" in message and "must add up to 1" in message
    assert ProfileForm(_data(eviction_weight_relevance=0.5, eviction_weight_recency=0.3,
                             eviction_weight_density=0.2), owner=alice).is_valid()


@pytest.fixture
def root_client(db) -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.org", "pw"))
    return client


def _admin_post(client: Client, alice, **overrides) -> str:
    data = _data(owner=alice.pk, created_0="2026-01-01", created_1="00:00:00", **overrides)
    return client.post("/admin/contextlab_sessions/agentprofile/add/", data).content.decode()


def _row(page: str, name: str) -> str:
    row = page[page.index(f"field-{name}"):]
    return row[:row.index("</div>\n\n") if "</div>\n\n" in row else 1_500]


def test_the_admin_takes_tool_names_as_text(root_client, alice):
    from contextlab.sessions.models import AgentProfile

    _admin_post(root_client, alice, exempt_tool_names="Bash, Read\nGrep")
    assert AgentProfile.objects.get(name="tuned").exempt_tool_names == ["Bash", "Read", "Grep"]


def test_the_admin_says_each_problem_once(root_client, alice):
    page = _admin_post(root_client, alice, recent_n=-5, compact_ratio=1.5, reserve_ratio=0.8)
    assert page.count("recent_n must be a whole number from 1 to 100") == 1
    assert page.count("compact_ratio must be a number from 0.1 to 0.95") == 1
    assert page.count("reserve_ratio must be a number from 0.01 to 0.5") == 1
    assert "greater than or equal to" not in page and "less than or equal to" not in page
    assert "Enter a valid JSON" not in page
