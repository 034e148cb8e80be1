"""Loss at compaction time: identifiers of the compacted messages that the new summary drops."""

from __future__ import annotations

from contextlab.lib.compaction_loss import lost_at_compaction, named_references
from contextlab.sessions import compaction_loss
from contextlab.sessions.models import SummaryVersion
from tests.dashboard.conftest import work


def test_it_flags_an_identifier_kept_neither_by_the_summary_nor_by_a_file_it_names():
    compacted = [("m1", "Edited lib/foo.ex and read https://example.org/spec; commit 3f2a9c1d."),
                 ("m2", "Ran `mix test` against /srv/app/config.exs")]
    summary = "## Progress\n- edited lib/foo.ex; see tool_result/a.txt\n"
    loss = lost_at_compaction(compacted, summary, [("tool_result/a.txt", "output of `mix test`")])
    assert {(lost.value, lost.message_id) for lost in loss.lost} == {
        ("https://example.org/spec", "m1"), ("3f2a9c1d", "m1"), ("/srv/app/config.exs", "m2")}
    assert loss.count == 3 and loss.references == ["tool_result/a.txt"]


def test_it_counts_each_identifier_once_and_ignores_the_truncation_notice_advice():
    notice = "If the current content is not enough, call `read_file` with file_path=tool_result/x.txt"
    loss = lost_at_compaction([("m1", f"/a/b.log\n{notice}"), ("m2", "/a/b.log again")], "nothing kept")
    assert [(lost.value, lost.message_id) for lost in loss.lost] == [("/a/b.log", "m1"), ("tool_result/x.txt", "m1")]


def test_it_names_only_the_files_the_summary_mentions():
    assert named_references("see tool_result/b.txt", ["tool_result/a.txt", "tool_result/b.txt"]) == [
        "tool_result/b.txt"]


def test_it_stores_the_check_with_each_summary_version(alice_session):
    work(alice_session, 12)
    versions = list(SummaryVersion.objects.filter(session=alice_session))
    assert versions and all(v.lost_count is not None for v in versions)
    for version in versions:
        loss = compaction_loss.check(alice_session, version)
        assert version.lost_count == loss.count
        assert [f["value"] for f in version.lost_at_compaction] == [lost.value for lost in loss.lost]
        for flag in version.lost_at_compaction:
            assert flag["value"] not in version.text
            assert flag["message_id"] in version.compacted_ids
    assert any(v.lost_count for v in versions)


def test_it_checks_versions_written_before_the_check_existed(alice_client, alice_session):
    work(alice_session, 12)
    SummaryVersion.objects.filter(session=alice_session).update(lost_count=None, lost_at_compaction=None)
    page = alice_client.get(f"{alice_session.get_absolute_url()}summaries/").content.decode()
    latest = SummaryVersion.objects.filter(session=alice_session).last()
    assert latest.lost_count is not None
    assert f'id="lost-at-compaction" data-count="{latest.lost_count}"' in page
