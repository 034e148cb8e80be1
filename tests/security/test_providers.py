"""Issue 12, item 2: which hosts the server calls, and with which secret, is the operator's choice.

The exfiltration shown in the review: a profile pointing its summaries at an
outside listener with ``compaction_api_key_env = DATABASE_URL``, after which
every compaction sent ``Bearer <the database URL>`` there.
"""

from __future__ import annotations

import io
import json
import zipfile
from typing import Any

import pytest

from contextlab.gateway.models import UpstreamProvider
from contextlab.sessions import services
from contextlab.sessions.models import AgentProfile, CompactionRun
from contextlab.support import jobs, providers
from tests.conversations import answer, tool_turn
from tests.fakellm import FakeLLM, Reply, Status

SUMMARY = "## Goal\n- build\n## Progress\n### Done\n- t1\n## Next Steps\n- t2\n"
SMALL = {"max_input_length": 4_000, "recent_n": 2, "recent_max_bytes": 1_500, "old_max_bytes": 400}
SECRET = "postgres://owner:s3cret-password@db.internal:5432/contextlab"


def _fill_and_compact(api, profile_id: int, **options: bool) -> Any:
    session = api.post("/api/v1/sessions", {"system_prompt": "You are careful.", "profile": profile_id}).json()
    for i in range(1, 4):
        api.post(f"/api/v1/sessions/{session['id']}/messages",
                 {"messages": [*([answer(i - 1)] if i > 1 else []), *tool_turn(i)]})
    return api.post(f"/api/v1/sessions/{session['id']}/compact", options)


@pytest.mark.parametrize("knobs", [
    {"compaction_base_url": "{listener}", "compaction_api_key_env": "DATABASE_URL"},
    {"compaction_base_url": "{listener}"},
    {"compaction_api_key_env": "DATABASE_URL"},
])
def test_it_refuses_a_profile_that_names_a_url_or_a_key_variable(api, settings, monkeypatch, knobs):
    monkeypatch.setenv("DATABASE_URL", SECRET)
    with FakeLLM([Reply(SUMMARY)]) as listener:
        body = {k: v.format(listener=listener.base_url) for k, v in knobs.items()}
        response = api.post("/api/v1/profiles", {"name": "exfiltrate", **SMALL, "compactor": "openai",
                                                 "compaction_model": "m", **body})
        assert response.status_code == 422
        assert response.json()["field"] in body
        assert not AgentProfile.objects.filter(name="exfiltrate").exists()
        assert listener.requests == []


def test_it_refuses_a_provider_the_operator_did_not_offer(api, settings):
    settings.CONTEXTLAB_PROVIDERS = {"openai": {"base_url": "https://api.openai.com/v1", "api_key_env": "K"}}
    response = api.post("/api/v1/profiles", {"name": "p", "compactor": "openai", "compaction_model": "m",
                                             "compaction_provider": "http://127.0.0.1:9/v1"})
    assert response.status_code == 422
    assert response.json()["field"] == "compaction_provider"
    assert "'openai'" in response.json()["error"]
    needs_one = api.post("/api/v1/profiles", {"name": "q", "compactor": "openai", "compaction_model": "m"})
    assert needs_one.status_code == 422 and needs_one.json()["field"] == "compaction_provider"


def test_the_dashboard_form_offers_only_the_operators_providers(client, alice, settings):
    client.force_login(alice)
    settings.CONTEXTLAB_PROVIDERS = {"local": {"base_url": "http://127.0.0.1:9/v1"}}
    page = client.get("/profiles/new/").content.decode()
    assert '<select name="compaction_provider"' in page and 'value="local"' in page
    assert 'name="compaction_base_url"' not in page and 'name="compaction_api_key_env"' not in page


def test_a_providers_key_goes_to_that_provider_only(api, settings, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", SECRET)
    monkeypatch.setenv("CONTEXTLAB_TEST_SUMMARY_KEY", "sk-summary")
    with FakeLLM([Reply(SUMMARY)]) as provider, FakeLLM([Reply(SUMMARY)]) as listener:
        settings.CONTEXTLAB_PROVIDERS = {"summary": {"base_url": provider.base_url,
                                                     "api_key_env": "CONTEXTLAB_TEST_SUMMARY_KEY"}}
        profile = api.post("/api/v1/profiles", {"name": "p", **SMALL, "compactor": "openai",
                                                "compaction_model": "m", "compaction_provider": "summary"})
        assert profile.status_code == 201, profile.json()
        assert "compaction_api_key_env" not in profile.json() and "compaction_base_url" not in profile.json()
        done = _fill_and_compact(api, profile.json()["id"])
        assert done.status_code in (200, 201, 202), done.json()
        assert [r.headers["authorization"] for r in provider.requests] == ["Bearer sk-summary"]
        assert listener.requests == []


def test_a_missing_key_is_reported_without_naming_the_variable(api, alice, settings, monkeypatch):
    monkeypatch.delenv("CONTEXTLAB_TEST_ABSENT_KEY", raising=False)
    settings.CONTEXTLAB_PROVIDERS = {"summary": {"base_url": "http://127.0.0.1:9/v1",
                                                 "api_key_env": "CONTEXTLAB_TEST_ABSENT_KEY"}}
    profile = services.profile_create(owner=alice, name="p", knobs={
        **SMALL, "compactor": "openai", "compaction_model": "m", "compaction_provider": "summary"})
    response = _fill_and_compact(api, profile.pk)
    text = json.dumps(response.json())
    assert response.status_code == 422 and "no API key configured" in text
    assert "CONTEXTLAB_TEST_ABSENT_KEY" not in text and "environment variable" not in text


@pytest.mark.django_db(transaction=True)
def test_an_upstream_error_is_kept_bounded_and_on_one_line(api, alice, settings):
    noisy = "overloaded\n\x1b[31m" + "x" * 50_000
    with FakeLLM([Status(400, noisy)]) as provider:
        settings.CONTEXTLAB_PROVIDERS = provider.provider
        profile = services.profile_create(owner=alice, name="p", knobs={
            **SMALL, "compactor": "openai", "compaction_model": "m", "compaction_provider": "fake",
            "compaction_retries": 0})
        settings.CONTEXTLAB_JOBS_MODE = "embedded"
        response = _fill_and_compact(api, profile.pk, background=True)
        assert response.status_code == 202
        assert jobs.drain(30)
    run = CompactionRun.objects.get(pk=response.json()["run"]["id"]).to_dict()
    # The engine falls back to the offline summary; the run says why, in few words.
    assert run["outcome"] in ("fallback_summary", "compaction_failed")
    assert "overloaded" in run["error"]
    assert len(run["error"]) <= providers.MAX_RUN_ERROR_CHARS
    assert "\n" not in run["error"] and "\x1b" not in run["error"]


def test_a_bundle_cannot_point_the_imported_profile_anywhere(api, alice, settings, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", SECRET)
    session = services.session_create(owner=alice, system_prompt="You are careful.",
                                      profile=services.profile_create(owner=alice, name="src", knobs=SMALL))
    bundle = services.session_export(session=session)
    with FakeLLM([Reply(SUMMARY)]) as listener:
        source = zipfile.ZipFile(io.BytesIO(bundle))
        rewritten = io.BytesIO()
        with zipfile.ZipFile(rewritten, "w") as target:
            for item in source.infolist():
                data = source.read(item.filename)
                if item.filename == "session.json":
                    manifest = json.loads(data)
                    manifest["profile"].update(name="evil", compactor="openai", compaction_model="m",
                                               compaction_base_url=listener.base_url,
                                               compaction_api_key_env="DATABASE_URL",
                                               compaction_provider="elsewhere")
                    data = json.dumps(manifest).encode()
                target.writestr(item, data)
        imported = services.session_import_bundle(owner=alice, data=rewritten.getvalue())
        assert imported.profile.compactor == "extractive" and imported.profile.compaction_provider == ""
        done = _fill_and_compact(api, imported.profile.pk)
        assert done.status_code in (200, 201, 202)
        assert listener.requests == []


def test_gateway_keys_are_stored_encrypted_and_read_back(small_profile):
    row = UpstreamProvider(profile=small_profile, base_url="https://llm.example/v1")
    row.store_api_key("sk-entered-by-a-person")
    row.save()
    stored = UpstreamProvider.objects.values_list("api_key", flat=True).get(pk=row.pk)
    assert "sk-entered-by-a-person" not in stored and stored.startswith("fernet:")
    assert UpstreamProvider.objects.get(pk=row.pk).resolve_api_key() == "sk-entered-by-a-person"


def test_the_operators_list_is_checked(settings):
    for bad in ('{"x": {"base_url": "file:///etc/passwd"}}', '{"x": {"base_url": "https://a", "api_key_env": "A B"}}',
                '{"../x": {"base_url": "https://a"}}', "[1]", "not json"):
        settings.CONTEXTLAB_PROVIDERS = bad
        with pytest.raises(providers.ProvidersMisconfigured):
            providers.configured()


def test_a_provider_list_that_cannot_be_read_fails_the_system_checks(settings):
    from django.core.checks import run_checks

    settings.CONTEXTLAB_PROVIDERS = '{"x": {"base_url": "ftp://a"}}'
    assert "contextlab.E002" in {message.id for message in run_checks()}
    settings.CONTEXTLAB_PROVIDERS = '{"x": {"base_url": "https://a/v1"}}'
    assert "contextlab.E002" not in {message.id for message in run_checks()}
