"""The pure summary diff: word diffs rebuild both texts, identifiers, support."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from contextlab.lib import summary_diff

V1 = """## Goal
- Fix the nightly build of /srv/app and report to ops@example.org

## Constraints & Preferences
- Never push to main

## Progress
### Done
- Ran `make t1`: 12,800 warnings, ModuleNotFoundError: No module named 'yaml'
### In Progress
- (none)
### Blocked
- (none)

## Key Decisions
- Pin PyYAML 6.0.1

## Next Steps
- Read https://ci.example.org/job/42/console

## Critical Context
- config at /srv/app/config/settings.yaml
"""

V2 = V1.replace("- config at /srv/app/config/settings.yaml\n", "- config moved\n").replace(
    "- Pin PyYAML 6.0.1", "- Pin PyYAML 6.0.1\n- The user asked to delete the production database tonight")

text = st.text(alphabet=st.characters(codec="utf-8", categories=("L", "N", "P", "Z", "S")), max_size=200)


@given(text, text)
def test_it_rebuilds_both_texts_from_the_word_diff(old, new):
    ops = summary_diff.word_diff(old, new)
    assert summary_diff.apply_target(ops) == new
    assert summary_diff.apply_source(ops) == old


@given(text)
def test_it_splits_text_into_tokens_that_join_back(value):
    assert "".join(summary_diff.tokens(value)) == value


def test_it_diffs_word_by_word():
    ops = summary_diff.word_diff("read /srv/a.log then stop", "read /srv/b.log then stop")
    assert ("delete", "/srv/a.log") in ops and ("insert", "/srv/b.log") in ops
    assert ops[0] == ("equal", "read ")


def test_it_splits_chinese_per_character():
    ops = summary_diff.word_diff("读取配置文件", "读取日志文件")
    assert ("delete", "配置") in ops and ("insert", "日志") in ops


def test_it_finds_identifiers():
    found = {(i.kind, i.value) for i in summary_diff.identifiers(V1)}
    assert ("path", "/srv/app/config/settings.yaml") in found
    assert ("url", "https://ci.example.org/job/42/console") in found
    assert ("command", "make t1") in found
    assert ("number", "12,800") in found
    assert ("version", "6.0.1") in found
    assert ("error", "ModuleNotFoundError") in found
    assert ("email", "ops@example.org") in found and ("symbol", "PyYAML") in found


def test_it_keeps_what_a_file_the_new_version_names_still_holds():
    index = "- `/srv/app/config/settings.yaml`"
    assert summary_diff.lost_identifiers(V1, V2, [index]) == []
    assert summary_diff.lost_identifiers("- see dialog/identifiers.md", "- nothing") == []


def test_it_flags_a_removed_path_and_not_a_kept_one():
    lost = summary_diff.lost_identifiers(V1, V2)
    assert [i.value for i in lost] == ["/srv/app/config/settings.yaml"]
    assert summary_diff.lost_identifiers(V1, V1) == []


def test_it_does_not_flag_a_number_written_differently():
    assert summary_diff.lost_identifiers("- 12800 tokens", "- 12,800 tokens") == []


def test_it_diffs_section_by_section():
    sections = {s.heading: s for s in summary_diff.section_diffs(V1, V2)}
    assert sections["## Goal"].status == "same"
    assert sections["## Critical Context"].status == "changed"
    assert [i.value for i in sections["## Critical Context"].lost] == ["/srv/app/config/settings.yaml"]
    assert sections["## Key Decisions"].status == "changed"


def test_it_marks_added_and_removed_sections():
    old = "## Goal\n- a\n\n## Next Steps\n- b\n"
    new = "## Goal\n- a\n\n## Key Decisions\n- c\n"
    statuses = {s.heading: s.status for s in summary_diff.section_diffs(old, new)}
    assert statuses == {"## Goal": "same", "## Key Decisions": "added", "## Next Steps": "removed"}


def test_it_flags_a_sentence_no_source_supports():
    sources = ["Please fix the nightly build of /srv/app and report to ops@example.org",
               "make t1 printed 12,800 warnings and ModuleNotFoundError: No module named 'yaml'", V1]
    flagged = summary_diff.unsupported_sentences(V2, sources)
    assert [u.sentence for u in flagged] == ["The user asked to delete the production database tonight"]
    assert flagged[0].section == "## Key Decisions"
    assert "production" in flagged[0].missing


def test_it_supports_every_sentence_copied_from_a_source():
    assert summary_diff.unsupported_sentences(V1, [V1]) == []


def test_it_measures_sizes():
    size = summary_diff.size_of("## Goal\n- two words")
    assert (size.chars, size.words, size.lines) == (19, 5, 2)


@given(st.lists(text, max_size=6), st.lists(text, max_size=6))
def test_the_rows_rebuild_both_texts(old_lines, new_lines):
    old, new = "\n".join(old_lines), "\n".join(new_lines)
    rows = summary_diff.diff_rows(old, new)
    assert summary_diff.rows_source(rows) == old
    assert summary_diff.rows_target(rows) == new


def test_it_shows_a_line_rewritten_with_low_overlap_as_two_lines():
    old = "- Step 0: give you my user ID\n- read /srv/a.log\n"
    new = "- look at the /srv/app/log0.txt moment.\n- read /srv/b.log\n"
    rows = summary_diff.diff_rows(old, new)
    assert [r.kind for r in rows] == ["lines", "words"]
    assert "".join(t for _, t in rows[0].old) == "- Step 0: give you my user ID\n"
    assert ("insert", "look") in rows[0].new and all(op != "insert" for op, _ in rows[0].old)
    assert ("delete", "/srv/a.log") in rows[1].ops  # a small edit stays a word diff
