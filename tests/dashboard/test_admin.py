from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import User
from django.forms.models import model_to_dict
from django.test import Client

from contextlab.sessions import services
from contextlab.sessions.models import AgentSession, ProfileVersion
from tests.conversations import tool_turn


@pytest.fixture
def admin_client_logged_in(db) -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.org", "pw"))
    return client


def test_it_lists_and_opens_every_model(admin_client_logged_in, alice_session):
    services.messages_append(session=alice_session, messages=tool_turn(1, output_bytes=3_000))
    services.session_prepare(session=alice_session)
    services.compaction_run(session=alice_session)
    for model in ("agentprofile", "agentsession", "sessionmessage", "turn", "summaryversion", "offloadedfile",
                  "compactionrun"):
        response = admin_client_logged_in.get(f"/admin/contextlab_sessions/{model}/")
        assert response.status_code == 200, model
    assert admin_client_logged_in.get(f"/admin/contextlab_sessions/agentsession/{alice_session.pk}/change/").status_code == 200
    assert admin_client_logged_in.get("/admin/api/apitoken/").status_code == 200


def test_it_validates_profiles_through_the_engine(admin_client_logged_in, alice):
    response = admin_client_logged_in.post("/admin/contextlab_sessions/agentprofile/add/", {
        "owner": alice.pk, "name": "bad", "policy": "contextlab", "max_input_length": 4_000, "compact_ratio": 0.3,
        "reserve_ratio": 0.3, "recent_n": 3, "recent_max_bytes": 50_000, "old_max_bytes": 3_000,
        "markdown_recent_max_bytes": 150_000, "markdown_old_max_bytes": 10_000, "retention_days": 30,
        "tokenizer": "o200k_base", "estimate_divisor": 4.0, "compactor": "extractive",
        "compaction_timeout": 60, "compaction_retries": 2, "summary_language": "auto", "exempt_tool_names": "[]",
        "browser_tool_names": "[]", "read_file_tool_names": "[]", "timezone": "UTC",
        "max_message_bytes": 16_000_000, "created_0": "2026-01-01", "created_1": "00:00:00",
    })
    assert response.status_code == 200  # the form again, with the error
    assert "must be smaller than the compaction threshold" in response.content.decode()


def test_it_deletes_the_workspace_with_the_session(admin_client_logged_in, alice_session):
    services.messages_append(session=alice_session, messages=tool_turn(1, output_bytes=3_000))
    workspace = alice_session.workspace
    assert workspace.is_dir()
    response = admin_client_logged_in.post(f"/admin/contextlab_sessions/agentsession/{alice_session.pk}/delete/",
                                           {"post": "yes"})
    assert response.status_code == 302
    assert not AgentSession.objects.exists()
    assert not workspace.exists()


def test_an_admin_change_of_a_profile_is_a_version_by_the_admin(admin_client_logged_in, alice, small_profile):
    data = {k: v for k, v in model_to_dict(small_profile).items() if v is not None}
    data.update({"owner": alice.pk, "compact_ratio": 0.65, "created_0": "2026-01-01", "created_1": "00:00:00"})
    for name in ("exempt_tool_names", "browser_tool_names", "read_file_tool_names"):
        data[name] = json.dumps(data[name])
    response = admin_client_logged_in.post(f"/admin/contextlab_sessions/agentprofile/{small_profile.pk}/change/", data)
    assert response.status_code == 302, response.content.decode()[:2000]
    version = ProfileVersion.objects.get(profile=small_profile, number=2)
    assert (version.source, version.changed_by.username) == ("admin", "root")
    assert {"field": "compact_ratio", "old": 0.7, "new": 0.65} in version.changes
    assert admin_client_logged_in.get("/admin/contextlab_sessions/profileversion/").status_code == 200
