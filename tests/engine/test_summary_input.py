"""What reaches a summary: a language fixed for the session, and no terminal escape codes."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from contextlab.engine.compactors.base import SummaryRequest
from contextlab.engine.core.ansi import strip_ansi, without_ansi
from contextlab.engine.core.messages import Message, TextBlock, ToolResultBlock
from contextlab.engine.core.profile import Profile
from contextlab.engine.hook import ContextManager
from contextlab.engine.stages.summary.prompts import language_of_summary
from tests.engine.sessions import assistant, log_lines, tool_round, user

SMALL = Profile(max_input_length=4_000, recent_n=2, recent_max_bytes=6_000, old_max_bytes=600,
                markdown_recent_max_bytes=8_000, markdown_old_max_bytes=2_000)
# Enough English turns for a first compaction (it waits until CoPaw's own estimate would compact).
ENGLISH_TURNS = 10
COLOURED = "\x1b[2m  12 passed\x1b[0m in \x1b[1;32m0.31s\x1b[0m\n\x1b]8;;https://x.test\x07link\x1b]8;;\x07\n"


def english_turn(i: int) -> list[Message]:
    return [user(f"step {i}: please compile module {i}"),
            *tool_round("bash", {"command": f"make m{i}"}, [log_lines(50, f"m{i}")]),
            assistant(f"module {i} compiled")]


def chinese_turn(i: int) -> list[Message]:
    return [user(f"第{i}步：请编译模块{i}，然后告诉我结果。这一步很重要，请仔细检查输出。"),
            *tool_round("bash", {"command": f"make z{i}"}, [log_lines(50, f"z{i}")]),
            assistant(f"模块{i}已经编译完成，没有发现任何错误，接下来我会继续处理下一个模块。")]


def test_it_keeps_the_language_of_the_first_summary_when_the_session_switches(tmp_path) -> None:
    m = ContextManager(SMALL, tmp_path / "ws")
    for i in range(ENGLISH_TURNS):
        m.append(english_turn(i))
        m.prepare()
    first_versions = len(m.summaries)
    assert first_versions and language_of_summary(m.summary) == "en"
    for i in range(18):
        m.append(chinese_turn(i))
        m.prepare()

    assert len(m.summaries) > first_versions + 1  # the Chinese turns were summarised too
    assert {language_of_summary(s.text) for s in m.summaries} == {"en"}
    assert m.summary_language == "en"
    payload_summary = m.summary_message()
    assert payload_summary is not None and "Summary of the earlier conversation" in payload_summary.plain_text()


def test_it_follows_the_profiles_language_over_the_conversations(tmp_path) -> None:
    m = ContextManager(SMALL.replace(summary_language="zh"), tmp_path / "ws")
    for i in range(ENGLISH_TURNS):
        m.append(english_turn(i))
        m.prepare()
    assert m.summaries and {language_of_summary(s.text) for s in m.summaries} == {"zh"}


def test_it_keeps_the_fixed_language_across_a_saved_state(tmp_path) -> None:
    m = ContextManager(SMALL, tmp_path / "ws")
    for i in range(ENGLISH_TURNS):
        m.append(english_turn(i))
        m.prepare()
    state = json.loads(json.dumps(m.export_state()))
    assert state["summary_language"] == "en"

    # A state saved before the language was stored: the summary's headings say it.
    del state["summary_language"]
    again = ContextManager.from_state(SMALL, m.workspace, state)
    for i in range(10):
        again.append(chinese_turn(i))
        again.prepare()
    assert len(again.summaries) > len(m.summaries)
    assert language_of_summary(again.summary) == "en"


def test_it_keeps_escape_codes_out_of_the_summary_but_in_the_archive(tmp_path) -> None:
    m = ContextManager(SMALL, tmp_path / "ws")
    failure = "\x1b[31mFAILED\x1b[0m tests/test_x.py::test_a - \x1b[1mAssertionError\x1b[0m: boom\n"
    m.append([user("run the tests"), *tool_round("bash", {"command": "pytest -q"}, [COLOURED + failure]),
              assistant("I'll use \x1b[1mpoetry\x1b[0m instead of pip from now on.")])
    m.prepare()
    for i in range(ENGLISH_TURNS):
        m.append(english_turn(i))
        m.prepare()

    assert m.summaries and all("\x1b" not in s.text for s in m.summaries)
    assert m.summary is not None
    assert "FAILED tests/test_x.py::test_a - AssertionError: boom" in m.summary
    assert "I'll use poetry instead of pip" in m.summary
    archived = "\n".join(json.dumps(rec) for _, rec in m.archive.iter_records())
    assert "\\u001b[31mFAILED" in archived and "\\u001b[1mpoetry" in archived  # the originals, codes and all


def test_it_cleans_a_summary_request_and_leaves_the_callers_messages_alone() -> None:
    result = Message(role="tool", content=(ToolResultBlock("c1", "bash", (TextBlock(COLOURED),)),))
    plain = Message.text("user", "no codes here")

    request = SummaryRequest([plain, result], "## Goal\n\x1b[1mship\x1b[0m", "en")

    assert request.messages[0] is plain
    assert request.messages[1].tool_results[0].output_text() == "  12 passed in 0.31s\nlink\n"
    assert "\x1b" in result.tool_results[0].output_text()
    assert request.previous_summary == "## Goal\nship"


_CODES = st.sampled_from(["\x1b[0m", "\x1b[1;31m", "\x1b[2K", "\x1b]0;title\x07", "\x1b[38;5;208m", "\x1b(B"])


@given(st.lists(st.one_of(st.text(alphabet=st.characters(blacklist_characters="\x1b")), _CODES), max_size=12))
def test_it_removes_every_escape_code_and_nothing_else(pieces: list[str]) -> None:
    text = "".join(pieces)
    plain = "".join(p for p in pieces if not p.startswith("\x1b"))

    assert strip_ansi(text) == plain
    cleaned = without_ansi([Message.text("assistant", text)])[0]
    assert cleaned.plain_text() == plain


def test_it_keeps_escape_codes_out_of_memory_notes() -> None:
    from contextlab.engine.core.messages import ToolUseBlock
    from contextlab.engine.memory.long_term import extract_memory_notes

    def call(call_id: str, command: str, output: str, is_error: bool) -> list[Message]:
        return [Message(role="assistant", content=(ToolUseBlock(call_id, "bash", {"command": command}),)),
                Message(role="tool", content=(ToolResultBlock(call_id, "bash", output, is_error),))]

    notes = extract_memory_notes([
        user("\x1b[1mI prefer pnpm over npm.\x1b[0m"),
        *call("1", "npm install", "\x1b[31mnpm ERR!\x1b[0m code ERESOLVE\n[exit code 1]", True),
        *call("2", "pnpm install", "Done in 4.2s", False),
    ])

    assert notes.preferences == ["I prefer pnpm over npm."]
    assert notes.lessons == ['bash `npm install` failed with "npm ERR! code ERESOLVE"; bash `pnpm install` worked']
