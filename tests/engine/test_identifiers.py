"""The identifier extractor, and the post-check that no summary loses an identifier silently."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from contextlab.engine.compactors.base import SummaryRequest
from contextlab.engine.compactors.extractive import ExtractiveCompactor
from contextlab.engine.core.messages import Message, ToolResultBlock, ToolUseBlock
from contextlab.engine.core.profile import Profile
from contextlab.engine.hook import ContextManager
from contextlab.engine.stages.summary.identifiers import (
    INDEX_FILE,
    Identifier,
    base_name_kept,
    extract_identifiers,
    keep_identifiers,
    normalize,
)
from tests.engine.sessions import assistant, log_lines, tool_round, user


def _kinds(messages: list[Message]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for item in extract_identifiers(messages):
        found.setdefault(item.kind, []).append(item.value)
    return found


def test_it_finds_each_kind_in_user_and_assistant_text() -> None:
    kinds = _kinds([
        user("The upload fails with a KeyError in lib/app/uploads.py; keep the timeout at 30 s."),
        assistant("I'll rename `parse_upload/2` to `Uploads.Parser.parse/2` in the `UploadController`, "
                  "then run `mix test test/uploads_test.exs` (about 250 ms). ActiveSessionRegistry stays."),
    ])

    assert kinds["path"] == ["lib/app/uploads.py"]  # a path inside a command counts with the command
    assert kinds["error"] == ["KeyError"]
    assert kinds["number"] == ["30 s", "250 ms"]
    assert kinds["command"] == ["mix test test/uploads_test.exs"]
    assert kinds["symbol"] == ["parse_upload/2", "Uploads.Parser.parse/2", "UploadController",
                               "ActiveSessionRegistry"]


def test_it_reads_short_tool_arguments_and_skips_file_contents_and_outputs() -> None:
    long_command = "git commit -m \"$(cat <<'EOF'\nAdd the registry\nEOF\n)\""
    call = Message(role="assistant", content=(
        ToolUseBlock("c1", "Read", {"file_path": "/repo/lib/registry.ex"}),
        ToolUseBlock("c2", "Bash", {"command": long_command, "description": "Commit the SessionRegistry"}),
        ToolUseBlock("c3", "Write", {"file_path": "/repo/lib/new.ex",
                                     "content": "defmodule Hidden.Module do\n  def secret_fun, do: :ok\nend\n"}),
    ))
    result = Message(role="tool", content=(ToolResultBlock("c1", "Read", "defmodule OutputOnly.Name do"),))

    kinds = _kinds([call, result])

    assert kinds["path"] == ["/repo/lib/registry.ex", "/repo/lib/new.ex"]
    assert kinds["command"] == ["git commit -m \"$(cat <<'EOF'"]  # the first line names a heredoc
    assert kinds["symbol"] == ["SessionRegistry"]
    flat = str(kinds)
    assert "Hidden.Module" not in flat and "secret_fun" not in flat and "OutputOnly" not in flat


def test_it_ignores_dates_and_the_importers_placeholders_and_keeps_urls() -> None:
    from contextlab.engine.importers._common import repair

    messages = repair([user("See https://example.com/docs/api_keys.html from 2026/03/19."),
                       Message(role="assistant", content=(ToolUseBlock("h", "handoff", {}),))], [])
    assert extract_identifiers(messages) == [Identifier("url", "https://example.com/docs/api_keys.html")]


def test_it_finds_codes_ids_and_names_a_user_could_search_for() -> None:
    kinds = _kinds([user('Rebook ZZ9PLZ (order #W2378156, ticket INC-4242) for bob.k@example.com: commit '
                         '3f2a9c1d, release v2.4.1, "Project Falcon", 4711 seats, MAX_RETRIES; not 2026/03/19.')])
    assert kinds["code"] == ["ZZ9PLZ", "W2378156", "INC-4242"]
    assert kinds["email"] == ["bob.k@example.com"] and kinds["hash"] == ["3f2a9c1d"]
    assert kinds["version"] == ["v2.4.1"] and kinds["quoted"] == ["Project Falcon"]
    assert kinds["number"] == ["4711"] and kinds["symbol"] == ["MAX_RETRIES"]


def test_it_counts_a_base_name_as_the_looser_match() -> None:
    path = Identifier("path", "/home/u/project/lib/registry.ex")
    assert not base_name_kept(Identifier("symbol", "Registry"), normalize("the registry module"))
    assert base_name_kept(path, normalize("edited registry.ex")) and not base_name_kept(path, "edited lib")


def test_it_leaves_a_summary_that_keeps_everything_alone() -> None:
    messages = [user("Fix lib/app.py, it raises ValueError.")]
    summary = "## Goal\n- Fix lib/app.py (ValueError)\n"

    check = keep_identifiers(summary, messages, version=1)

    assert check.summary == summary and check.index_entry is None and check.total == 2 == check.in_summary


def test_it_appends_what_the_summary_dropped_and_indexes_the_rest() -> None:
    messages = [user(f"Look at `module_{n}/1` in lib/part_{n}.ex") for n in range(60)]
    summary = "## Goal\n- look at the modules\n## Critical Context\n- lib/part_0.ex\n"

    check = keep_identifiers(summary, messages, version=3, line_chars=400)

    added = check.summary[len(summary):]
    assert check.summary.startswith(summary) and len(added) <= 400 + 1
    assert added.startswith("- Identifiers from the compacted messages (all listed in dialog/identifiers.md): ")
    assert "`lib/part_1.ex`" in added and "more" in added
    assert check.index_entry is not None and check.index_entry.startswith("## Summary v3: 120 identifier(s)")
    assert "`module_59/1`" in check.index_entry and "`lib/part_59.ex`" in check.index_entry
    assert check.missing_after == 0


_NAMES = st.from_regex(r"[a-z]{2,8}(_[a-z]{2,6}){1,2}", fullmatch=True)
_PATHS = st.from_regex(r"(src|lib|test)/[a-z]{2,8}/[a-z_]{2,10}\.(py|ex|ts)", fullmatch=True)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(_NAMES, _PATHS), min_size=1, max_size=40), st.text(max_size=300),
       st.integers(min_value=0, max_value=2_000))
def test_it_never_loses_an_identifier_silently(pairs, summary, line_chars) -> None:
    messages = [user(f"Call `{name}()` from {path} and wait 5 s.") for name, path in pairs]

    check = keep_identifiers(summary, messages, version=1, line_chars=line_chars)

    text = normalize(check.summary)
    index = check.index_entry or ""
    for item in extract_identifiers(messages):
        assert item.value in text or (INDEX_FILE in text and f"`{item.value}`" in index)
    assert len(check.summary) <= len(summary.rstrip("\n")) + 1 + max(line_chars, 200) + 1


def test_it_runs_after_every_compaction_and_names_the_index(tmp_path) -> None:
    profile = Profile(max_input_length=4_000, recent_n=2, recent_max_bytes=6_000, old_max_bytes=600,
                      markdown_recent_max_bytes=8_000, markdown_old_max_bytes=2_000)
    m = ContextManager(profile, tmp_path / "ws")
    for i in range(10):
        m.append([user(f"step {i}: make `build_target_{i}` pass in src/mod_{i}/main.py"),
                  *tool_round("bash", {"command": f"make m{i}"}, [log_lines(40, f"m{i}")]),
                  assistant(f"Checked UploadRegistry{i} and SessionTracker{i}; both look fine.")])
        m.prepare()

    assert m.summaries
    index = (m.workspace / INDEX_FILE).read_text(encoding="utf-8") if (m.workspace / INDEX_FILE).exists() else ""
    for version in m.summaries:
        compacted = [msg for _, rec in m.archive.iter_records() if rec["id"] in version.compacted_ids
                     for msg in [Message.from_dict(rec)]]
        text = normalize(version.text)
        identifiers = extract_identifiers(compacted)
        assert any(i.value.startswith("SessionTracker") for i in identifiers)
        for item in identifiers:
            assert item.value in text or (INDEX_FILE in text and f"`{item.value}`" in index), item


def test_it_makes_the_extractive_summary_keep_most_identifiers_in_its_own_text() -> None:
    messages = [user("Refactor the upload path."),
                *[msg for n in range(12) for msg in tool_round(
                    "Edit", {"file_path": f"/srv/app/lib/uploads/part_{n}.ex"}, ["ok"],
                    text=f"Renaming `UploadPart{n}.parse/2` to `parse_part_{n}/2`.")]]
    summary = ExtractiveCompactor().summarize(SummaryRequest(messages, None, "en")).text

    check = keep_identifiers(summary, messages, version=1, line_chars=3_000)

    text = normalize(check.summary)
    identifiers = extract_identifiers(messages)
    assert sum(1 for i in identifiers if i.value in text) >= 0.9 * len(identifiers)


LLM_SUMMARY = """## Goal
Ship the build.
## Constraints & Preferences
(none)
## Progress
### Done
- compiled
### In Progress
- (none)
### Blocked
- (none)
## Key Decisions
- (none)
## Next Steps
1. test
## Critical Context
- (none)
"""


def test_it_adds_what_an_llm_summary_dropped(tmp_path) -> None:
    from contextlab.engine.compactors.openai_compat import OpenAICompactor
    from tests.fakellm import FakeLLM, Reply

    profile = Profile(max_input_length=200_000, compact_ratio=0.1, reserve_ratio=0.01)
    with FakeLLM([Reply(LLM_SUMMARY)]) as llm:
        m = ContextManager(profile, tmp_path / "ws",
                           compactor=OpenAICompactor(llm.base_url, "m", api_key_env=None))
        for i in range(6):
            m.append([user(f"q{i}: fix `UploadWorker{i}.run/1` in lib/uploads/worker_{i}.ex " + "word " * 2000),
                      assistant(f"a{i} " + "word " * 2000)])
        turn = m.prepare()

    assert turn.trace.outcome == "compacted" and m.summary is not None
    assert m.summary.startswith(LLM_SUMMARY.rstrip("\n"))
    compacted = m.summaries[-1].compacted_ids
    assert compacted
    for i in range(len([mid for mid in compacted if mid.startswith("u")])):
        assert f"`lib/uploads/worker_{i}.ex`" in m.summary and f"`UploadWorker{i}.run/1`" in m.summary
    assert "`UploadWorker0.run/1`" in (m.workspace / INDEX_FILE).read_text(encoding="utf-8")
