"""The loss check: identifiers of the compacted messages that the new summary drops, and what it did not check."""

from __future__ import annotations

import string

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextlab.engine.core.messages import Message, ToolResultBlock, ToolUseBlock
from contextlab.engine.stages.summary.identifiers import INDEX_FILE, KINDS, fold, keep_identifiers
from contextlab.lib.loss_check import lost_at_compaction, named_references
from contextlab.sessions import loss_records
from contextlab.sessions.models import SummaryVersion
from tests.conversations import answer, tool_turn
from tests.dashboard.conftest import work
from tests.engine.sessions import assistant, user

ISSUE_TEXT = "please also check reservation ZZ9PLZ and the file /srv/ux/audit.log"


def test_it_flags_an_identifier_kept_neither_by_the_summary_nor_by_a_file_it_names():
    compacted = [user("Edited lib/foo.ex and read https://example.org/spec; commit 3f2a9c1d."),
                 assistant("Ran `mix test` against /srv/app/config.exs")]
    summary = "## Progress\n- edited lib/foo.ex; see tool_result/a.txt\n"
    loss = lost_at_compaction(compacted, summary, [("tool_result/a.txt", "output of `mix test`")])
    assert {(lost.value, lost.kind, lost.message_id) for lost in loss.lost} == {
        ("https://example.org/spec", "url", compacted[0].id), ("3f2a9c1d", "hash", compacted[0].id),
        ("/srv/app/config.exs", "path", compacted[1].id)}
    assert loss.count == 3 and loss.references == ["tool_result/a.txt"]
    assert not loss.nothing_lost


def test_it_finds_a_code_written_in_prose():
    # The issue's report: a booking code in a user's sentence was lost and the check said nothing.
    loss = lost_at_compaction([user(ISSUE_TEXT)], "## Goal\n- check /srv/ux/audit.log\n")
    assert [(lost.kind, lost.value) for lost in loss.lost] == [("code", "ZZ9PLZ")]


def test_it_never_reports_contextlabs_own_files_as_a_loss():
    compacted = [user(f"see {INDEX_FILE} and tool_result/9f86d081884c7d65.txt and dialog/2026-12-04.jsonl")]
    loss = lost_at_compaction(compacted, "nothing kept")
    assert loss.lost == [] and loss.count == 0


def test_it_says_what_it_did_not_check():
    call = Message(role="assistant", content=(ToolUseBlock("c1", "Write", {"file_path": "/srv/a.py",
                                                                          "content": "x = 1\n" * 80}),))
    result = Message(role="tool", content=(ToolResultBlock("c1", "Write", "wrote REF77X"),))
    loss = lost_at_compaction([call, result], "wrote /srv/a.py")
    assert loss.count == 0
    assert {u.what: u.count for u in loss.unchecked} == {"long tool-call argument": 1, "tool output": 1}
    assert not loss.nothing_lost  # no loss found, but not everything was searched
    assert lost_at_compaction([user("fix /srv/a.py")], "fixed /srv/a.py").nothing_lost


def test_it_counts_each_identifier_once_oldest_message_first():
    first, second = user("/a/b.log please"), user("/a/b.log again")
    loss = lost_at_compaction([first, second], "nothing kept")
    assert [(lost.value, lost.message_id) for lost in loss.lost] == [("/a/b.log", first.id)]


def test_it_names_only_the_files_the_summary_mentions():
    assert named_references("see tool_result/b.txt", ["tool_result/a.txt", "tool_result/b.txt"]) == [
        "tool_result/b.txt"]


# -- the property: the verdict is a brute-force search of summary + index ------------------------------

_UPPER, _LOWER, _HEX = string.ascii_uppercase, string.ascii_lowercase, "0123456789abcdef"


def _mixed(alphabet: str, low: int, high: int) -> st.SearchStrategy[str]:
    # Letters and digits both present, so the token is a code (or a hash), never a plain word or number.
    return st.tuples(st.text(alphabet, min_size=low, max_size=high), st.sampled_from(alphabet.strip(string.digits)),
                     st.sampled_from(string.digits)).map(lambda t: t[1] + t[0] + t[2])


_word = st.text(_LOWER, min_size=3, max_size=8)
_cap = _word.map(str.capitalize)
PLANTED: dict[str, st.SearchStrategy[str]] = {
    "code": _mixed(_UPPER + string.digits, 3, 6).map(lambda v: "Q" + v),
    "path": st.lists(_word, min_size=2, max_size=4).map(lambda parts: "/" + "/".join(parts) + ".log"),
    "url": st.tuples(_word, _word).map(lambda t: f"https://{t[0]}.example.org/{t[1]}"),
    "email": st.tuples(_word, _word).map(lambda t: f"{t[0]}.{t[1]}@example.com"),
    "hash": _mixed("abcdef0123456789", 8, 30).map(lambda v: "e" + v),
    "version": st.tuples(*(st.integers(0, 40),) * 3).map(lambda t: "v{}.{}.{}".format(*t)),
    "quoted": st.tuples(_cap, _cap).map(lambda t: f"{t[0]} {t[1]}"),
    "symbol": st.tuples(_cap, _cap, _word).map(lambda t: t[0] + t[1] + t[2].capitalize()),
    "error": _cap.map(lambda v: v + "Error"),
    "number": st.integers(1_000, 9_999_999).map(str),
    "command": _word.map(lambda w: f"git checkout {w}"),
    "token": st.tuples(_word, _word).map(lambda t: f"{t[0]}/{t[1]}"),
}
FILLER = ["please", "check", "also", "then", "and", "the", "about", "before", "we", "ship"]


def _say(kind: str, value: str) -> str:
    return {"quoted": f'"{value}"', "command": f"`{value}`"}.get(kind, value)


@st.composite
def spans(draw: st.DrawFn) -> tuple[list[Message], list[tuple[str, str]], str, str]:
    planted = [(kind, draw(strategy)) for kind, strategy in PLANTED.items()]
    messages = []
    for start in range(0, len(planted), 3):
        words = [w for kind, value in planted[start:start + 3]
                 for w in (draw(st.sampled_from(FILLER)), _say(kind, value))]
        messages.append(user(" ".join(words) + "."))
    in_summary = draw(st.lists(st.sampled_from([v for _, v in planted]), unique=True))
    in_index = draw(st.lists(st.sampled_from([v for _, v in planted]), unique=True))
    summary = "## Critical Context\n" + "".join(f"- {v}\n" for v in in_summary) + f"- all in {INDEX_FILE}\n"
    index = "".join(f"- `{v}`\n" for v in in_index)
    return messages, planted, summary, index


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spans())
def test_it_agrees_with_a_brute_force_search_of_summary_and_index(span) -> None:
    messages, planted, summary, index = span
    loss = lost_at_compaction(messages, summary, [(INDEX_FILE, index)])
    haystack = fold(summary + "\n" + index)
    missing = {value for _, value in planted if fold(value) not in haystack}
    assert {lost.value for lost in loss.lost} == missing
    assert {lost.kind for lost in loss.lost} == {kind for kind, value in planted if value in missing}
    assert loss.checked == len(planted)
    assert loss.nothing_lost == (not missing)


@settings(max_examples=60, deadline=None)
@given(spans())
def test_it_finds_nothing_lost_once_the_post_check_wrote_the_index(span) -> None:
    # The index is built from the same definition: whatever the summary drops, the index the
    # post-check appends to it holds, and the check finds it there.
    messages, _, _, _ = span
    check = keep_identifiers("## Goal\n- ship it\n", messages, version=1, line_chars=200)
    loss = lost_at_compaction(messages, check.summary, [(INDEX_FILE, check.index_entry or "")])
    assert loss.nothing_lost, loss.lost


def test_every_kind_is_planted():
    assert set(PLANTED) == set(KINDS)


# -- stored with each version, through the API ----------------------------------------------------------

def _issue_session(api, session) -> str:
    base = f"/api/v1/sessions/{session.id}"
    for i in range(1, 12):
        api.post(f"{base}/messages", {"messages": [*([answer(i - 1)] if i > 1 else []),
                                                   *tool_turn(i, output_bytes=200)]})
        if i == 3:
            api.post(f"{base}/messages", {"messages": [{"role": "user", "content": ISSUE_TEXT}]})
    assert api.post(f"{base}/compact", {}).json()["run"]["status"] == "done"
    return base


def test_it_keeps_the_issues_code_and_says_what_it_did_not_check(api, alice_client, alice_session):
    base = _issue_session(api, alice_session)
    version = SummaryVersion.objects.get(session=alice_session, version=1)
    # The extractive summary dropped the ask; the post-check put the code back in its identifier
    # line and in the index it names.
    assert "ZZ9PLZ" in version.text and INDEX_FILE in version.text
    assert "`ZZ9PLZ`" in (alice_session.workspace / INDEX_FILE).read_text()
    loss = api.get(f"{base}/summaries").json()["summaries"][0]["loss"]
    assert loss["lost"] == [] and loss["lost_count"] == 0
    assert "code" in loss["checked_kinds"] and loss["references"] == [INDEX_FILE]
    assert [u["what"] for u in loss["unchecked"]] == ["tool output"]
    assert loss["nothing_lost"] is False  # tool outputs were not searched: no green "nothing lost"
    page = alice_client.get(f"{alice_session.get_absolute_url()}summaries/").content.decode()
    assert 'data-verdict="unsure"' in page and "Not checked:" in page and "Nothing lost" not in page


def _drop_from_summary(session, value: str) -> SummaryVersion:
    version = SummaryVersion.objects.get(session=session, version=1)
    version.text = version.text.replace(f"`{value}`", "")
    version.loss_scope = None  # checked again on the next read
    version.save()
    session.summary = version.text
    session.save()
    return version


def test_search_and_check_agree_when_only_the_index_keeps_it(api, alice_client, alice_session):
    base = _issue_session(api, alice_session)
    version = _drop_from_summary(alice_session, "ZZ9PLZ")
    assert "ZZ9PLZ" not in version.text
    assert api.get(f"{base}/summaries").json()["summaries"][0]["loss"]["lost"] == []
    search = alice_client.get(f"{alice_session.get_absolute_url()}search", {"q": "zz9plz"}).content.decode()
    assert "keeps it in the file it names" in search and "did not keep it" not in search


def test_it_reports_a_code_the_summary_and_index_lost_with_its_kind_and_message(api, alice_client, alice_session):
    base = _issue_session(api, alice_session)
    _drop_from_summary(alice_session, "ZZ9PLZ")
    (alice_session.workspace / INDEX_FILE).write_text("## Summary v1\n- paths: `/srv/ux/audit.log`\n")
    loss = api.get(f"{base}/summaries").json()["summaries"][0]["loss"]
    lost = {f["value"]: f for f in loss["lost"]}
    assert list(lost) == ["ZZ9PLZ"] and lost["ZZ9PLZ"]["kind"] == "code"
    message = alice_session.messages.get(message_id=lost["ZZ9PLZ"]["message_id"])
    assert ISSUE_TEXT in str(message.content)
    assert loss["nothing_lost"] is False
    # The search tells the same story: compacted into v1, which did not keep it.
    search = alice_client.get(f"{alice_session.get_absolute_url()}search", {"q": "ZZ9PLZ"}).content.decode()
    assert "did not keep it" in search


def test_it_stores_the_check_with_each_summary_version(alice_session):
    work(alice_session, 12)
    versions = list(SummaryVersion.objects.filter(session=alice_session))
    assert versions and all(v.lost_count is not None and v.loss_scope is not None for v in versions)
    for version in versions:
        loss = loss_records.check(alice_session, version)
        assert version.lost_count == loss.count
        assert [f["value"] for f in version.lost_at_compaction] == [lost.value for lost in loss.lost]
        assert version.loss()["unchecked"] == [u.to_dict() for u in loss.unchecked]
        for flag in version.lost_at_compaction:
            assert fold(flag["value"]) not in fold(version.text)
            assert flag["message_id"] in version.compacted_ids


def test_it_checks_versions_written_before_the_check_existed(alice_client, alice_session):
    work(alice_session, 12)
    SummaryVersion.objects.filter(session=alice_session).update(lost_count=None, lost_at_compaction=None,
                                                                loss_scope=None)
    page = alice_client.get(f"{alice_session.get_absolute_url()}summaries/").content.decode()
    latest = SummaryVersion.objects.filter(session=alice_session).last()
    assert latest.lost_count is not None and latest.loss_scope is not None
    assert f'id="lost-at-compaction" data-count="{latest.lost_count}"' in page
