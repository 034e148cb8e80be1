"""'Where did it go?': the history of a string."""

from __future__ import annotations

from contextlab.dashboard.search import search_session
from contextlab.lib.blocks import first_text
from contextlab.sessions.models import SessionMessage
from tests.dashboard.conftest import work


def _search(client, session, query):
    return client.get(f"{session.get_absolute_url()}search", {"q": query}).content.decode()


def test_it_follows_a_compacted_string_into_the_summary_and_the_archive(alice_client, worked_session):
    message = SessionMessage.objects.get(session=worked_session, seq=1)
    result = search_session(worked_session, "/srv/app/t1.log")
    hit = next(h for h in result.messages if h.message.seq == 1)
    texts = [e["text"] for e in hit.history]
    assert f"compacted in turn {message.compacted_turn} into summary v{message.summary_version}, which says it" \
        in texts
    assert f"archived at {message.archive_file}:{message.archive_line}" in texts
    assert any(a["file"] == message.archive_file and a["line"] == message.archive_line for a in result.archive)
    assert 1 in result.summary_versions
    page = _search(alice_client, worked_session, "/srv/app/t1.log")
    assert "<mark>/srv/app/t1.log</mark>" in page
    assert f"files/{message.archive_file}?line={message.archive_line}" in page


def test_it_finds_a_string_cut_out_of_the_live_text(alice_session):
    # Four turns: the oldest results slid out of recent_n and were re-cut, nothing compacted yet.
    work(alice_session, 4)
    worked_session = alice_session
    row = (SessionMessage.objects.filter(session=worked_session, status="live", truncated_stage=2)
           .order_by("seq").first())
    original, current = first_text(row.content), first_text(row.current_content)
    line = next(line for line in original.splitlines() if line and line not in current)
    result = search_session(worked_session, line)
    hit = next(h for h in result.messages if h.message.seq == row.seq)
    assert hit.in_original and not hit.in_current
    cut = next(e for e in hit.history if e["kind"] == "truncated")
    assert cut["text"].startswith("cut out of the live text at stage 2")
    assert cut["file"].startswith("tool_result/")
    assert any(f["path"] == cut["file"] for f in result.files)
    assert result.cut_count >= 1


def test_it_says_when_a_string_is_nowhere(alice_client, worked_session):
    assert "appears nowhere in this session" in _search(alice_client, worked_session, "no-such-thing-anywhere")


def test_it_searches_case_insensitively_and_beyond_ascii(alice_session):
    from contextlab.sessions import services

    services.messages_append(session=alice_session, messages=[{"role": "user", "content": "读取 \"配置\" 文件 Config"}])
    assert search_session(alice_session, "\"配置\"").message_count == 1
    assert search_session(alice_session, "config").message_count == 1
