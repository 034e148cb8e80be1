"""The summary diff viewer."""

from __future__ import annotations

from contextlab.sessions.models import SessionMessage, SummaryVersion

V1 = """## Goal
- Fix the nightly build of /srv/app

## Constraints & Preferences
- (none)

## Progress
### Done
- Read /srv/app/config/settings.yaml: port 8443

## Key Decisions
- (none)

## Next Steps
- Restart the worker

## Critical Context
- settings at /srv/app/config/settings.yaml
"""
V2 = (V1.replace("- Read /srv/app/config/settings.yaml: port 8443", "- Read the settings")
        .replace("- settings at /srv/app/config/settings.yaml", "- settings were read")
        .replace("- Restart the worker", "- Restart the worker\n- The user asked to wipe the billing tables"))


def _versions(session):
    ids = list(SessionMessage.objects.filter(session=session).order_by("seq").values_list("message_id", flat=True))
    SummaryVersion.objects.filter(session=session).delete()
    SummaryVersion.objects.create(session=session, version=1, text=V1, turn=3, compactor="extractive",
                                  compacted_ids=ids[:4])
    SummaryVersion.objects.create(session=session, version=2, text=V2, turn=6, compactor="openai",
                                  compacted_ids=ids[4:8])


def test_it_says_when_there_is_no_summary(alice_client, alice_session):
    page = alice_client.get(f"{alice_session.get_absolute_url()}summaries/").content.decode()
    assert "No summary yet" in page


def test_it_flags_a_removed_path_and_an_invented_sentence(alice_client, worked_session):
    _versions(worked_session)
    page = alice_client.get(f"{worked_session.get_absolute_url()}summaries/").content.decode()
    assert "v2</h2>" in page or "v2 against v1" in page
    lost = page[page.index('id="lost"'):page.index('id="unsupported"')]
    assert "/srv/app/config/settings.yaml" in lost and 'data-kind="path"' in lost
    assert "8443" in lost
    unsupported = page[page.index('id="unsupported"'):]
    assert "The user asked to wipe the billing tables" in unsupported
    assert "<del>" in page and "<ins>" in page
    assert 'data-section="## Critical Context"' in page


def test_it_shows_the_first_version_against_nothing(alice_client, worked_session):
    _versions(worked_session)
    page = alice_client.get(f"{worked_session.get_absolute_url()}summaries/", {"v": 1}).content.decode()
    assert "the first version" in page
    assert "The first version has nothing to lose" in page


def test_it_draws_the_size_of_every_version(alice_client, worked_session):
    page = alice_client.get(f"{worked_session.get_absolute_url()}summaries/").content.decode()
    versions = list(worked_session.summary_versions.values_list("version", flat=True))
    assert page.count('class="bar') >= len(versions)
    for version in versions:
        assert f"v{version}: " in page


def test_it_404s_a_missing_version(alice_client, worked_session):
    assert alice_client.get(f"{worked_session.get_absolute_url()}summaries/", {"v": 99}).status_code == 404


V3 = V2.replace("- Restart the worker", "- Step 0: give you my user ID before anything else")


def _three_versions(session):
    _versions(session)
    SummaryVersion.objects.create(session=session, version=3, text=V3, turn=9, compactor="extractive",
                                  compacted_ids=[])


def test_it_shows_a_rewritten_line_as_old_and_new_lines(alice_client, alice_session):
    _three_versions(alice_session)
    page = alice_client.get(f"{alice_session.get_absolute_url()}summaries/", {"v": 3}).content.decode()
    section = page[page.index('data-section="## Next Steps"'):]
    section = section[:section.index("</pre>")]
    assert 'class="line-old" data-row="lines"' in section and 'class="line-new"' in section
    old = section[section.index('class="line-old"'):section.index('class="line-new"')]
    assert "Restart" in old and "<del>" in old and "<ins>" not in old
    assert "give you my user ID" in section[section.index('class="line-new"'):]


def test_it_compares_any_two_versions(alice_client, alice_session):
    _three_versions(alice_session)
    page = alice_client.get(f"{alice_session.get_absolute_url()}summaries/", {"v": 3, "from": 1}).content.decode()
    assert "v3 against v1" in page
    lost = page[page.index('id="lost"'):page.index('id="unsupported"')]
    assert "/srv/app/config/settings.yaml" in lost  # in v1, gone by v3 (v2 is skipped)
    assert '<option value="1" selected>' in page
    assert alice_client.get(f"{alice_session.get_absolute_url()}summaries/", {"v": 3, "from": 9}).status_code == 404


def test_it_exports_a_version_with_its_diff_as_markdown(alice_client, alice_session):
    _three_versions(alice_session)
    response = alice_client.get(f"{alice_session.get_absolute_url()}summaries/", {"v": 3, "from": 1, "format": "md"})
    assert response["Content-Type"].startswith("text/markdown")
    assert 'filename="summary-v3-from-v1.md"' in response["Content-Disposition"]
    text = response.content.decode()
    assert text.startswith("# Summary v3 against v1")
    assert "- path `/srv/app/config/settings.yaml`" in text
    assert "- - ~~Restart~~" in text or "~~Restart" in text
    assert "+ - **Step 0:**" in text or "**Step" in text
    assert V3.strip() in text
