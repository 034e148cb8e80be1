"""The ``copaw`` policy's core against the vectors recorded by running ReMe 0.3.1.8 itself.

Every case of every section of ``reme-vectors-shared.json`` is a test; a few property tests cover
what the vectors cannot (no mutation, stable file paths, no broken UTF-8).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextlab.engine.policies.copaw import reference as copaw

SHARED_DIR = Path(
    os.environ.get("CONTEXTLAB_SHARED_DIR") or Path(__file__).resolve().parents[2].parent / "shared"
)
VECTORS_PATH = SHARED_DIR / "reference" / "reme-vectors-shared.json"

if not VECTORS_PATH.is_file():
    pytest.fail(
        f"ReMe reference vectors not found at {VECTORS_PATH}. Set CONTEXTLAB_SHARED_DIR to the folder "
        "that holds reference/reme-vectors-shared.json.",
        pytrace=False,
    )

VECTORS: dict[str, Any] = json.loads(VECTORS_PATH.read_text(encoding="utf-8"))
FIXED_TIMESTAMP: str = VECTORS["meta"]["fixed_timestamp_used"]
MARKER: str = VECTORS["meta"]["reme_constants"]["TRUNCATION_NOTICE_MARKER"]

TEXT_TOKEN_CASES = [case for case in VECTORS["token_counting"] if "text" in case]
MESSAGE_TOKEN_CASES = [case for case in VECTORS["token_counting"] if "message" in case]


def _text_case_id(case: dict[str, Any]) -> str:
    text = case["text"] if len(case["text"]) <= 12 else case["text"][:12] + "..."
    return f"d{case['divisor']}-{text!r}"


# --------------------------------------------------------------------------- helpers


def _parse_notice(text: str) -> dict[str, Any] | None:
    """The notice fields of a truncated output, shaped like the vectors' ``notice``."""
    if MARKER not in text:
        return None
    excerpt, rest = text.split(MARKER, 1)
    notice = MARKER + rest

    def number(pattern: str) -> int:
        match = re.search(pattern, notice)
        assert match, f"notice lacks {pattern!r}: {notice!r}"
        return int(match.group(1))

    path = re.search(r"file_path=(\S*) start_line=", notice)
    assert path, notice
    return {
        "content_bytes": len(excerpt.encode("utf-8")),
        "notice_text": notice,
        "total_lines": number(r"contains (\d+) lines in total"),
        "starts_at_line": number(r"starts at line (\d+)"),
        "covers_bytes": number(r"covers the next (\d+) bytes"),
        "read_from": number(r"start_line=(\d+) to read more"),
        "file_path": path.group(1),
    }


def _assert_output_matches(actual: str, expected: dict[str, Any]) -> None:
    assert actual == expected["text"]
    assert len(actual.encode("utf-8")) == expected["bytes"]
    assert (MARKER in actual) == expected["has_marker"]
    assert _parse_notice(actual) == expected["notice"]


class UuidSpy:
    """Records the file names ``compact_tool_results`` draws, in order, and names them <UUIDn>."""

    def __init__(self) -> None:
        self.drawn: list[str] = []

    def __call__(self) -> UUID:
        value = uuid4()
        self.drawn.append(value.hex)
        return value

    def normalise(self, text: str, directory: Path) -> str:
        for number, hex_name in enumerate(self.drawn, start=1):
            text = text.replace(hex_name, f"<UUID{number}>")
        return text.replace(str(directory), "<TOOL_RESULT_DIR>")

    def placeholder(self, file_name: str) -> str:
        return f"<UUID{self.drawn.index(Path(file_name).stem) + 1}>.txt"


def _message(role: str, content: Any) -> dict[str, Any]:
    return {"name": role, "role": role, "timestamp": FIXED_TIMESTAMP, "content": content}


# What the vector driver appended between passes. The JSON says it only in prose
# ("between_passes") and through the msg_index of the next pass's outputs. R08's pass 2 reports
# msg 2 = the string "continue" and msg 4 = tool result d2 "small" (not cut), so msg 3 is the
# assistant message calling d2: "a user message and a new small tool round".
APPENDED_BEFORE_PASS: dict[tuple[str, int], list[dict[str, Any]]] = {
    ("R08", 2): [
        _message("user", "continue"),
        _message(
            "assistant",
            [
                {
                    "type": "tool_use",
                    "id": "d2",
                    "name": "execute_shell_command",
                    "input": {"command": "echo small"},
                }
            ],
        ),
        _message(
            "system",
            [{"type": "tool_result", "id": "d2", "name": "execute_shell_command", "output": "small"}],
        ),
    ],
}


def _tool_result_block(message: dict[str, Any], tool_id: str) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = [
        b for b in message["content"] if b.get("type") == "tool_result" and b.get("id") == tool_id
    ]
    assert len(blocks) == 1, f"expected one tool_result {tool_id!r} in {message!r}"
    return blocks[0]


# --------------------------------------------------------------------------- token counting


@pytest.mark.parametrize("case", TEXT_TOKEN_CASES, ids=_text_case_id)
def test_it_estimates_text_tokens_like_the_rule_counter(case: dict[str, Any]) -> None:
    assert len(case["text"].encode("utf-8")) == case["bytes"]
    assert copaw.rule_estimate_tokens(case["text"], case["divisor"]) == case["rule_estimate"]
    assert copaw.estimate_text_tokens(case["text"], case["divisor"]) == case["count_str_token"]


@pytest.mark.parametrize("case", MESSAGE_TOKEN_CASES, ids=lambda case: case["case"])
def test_it_estimates_message_tokens_like_stat_message(case: dict[str, Any]) -> None:
    blocks = copaw.estimate_block_tokens(case["message"], case["divisor"])
    assert blocks == [(block["type"], block["tokens"]) for block in case["blocks"]]
    assert copaw.estimate_message_tokens(case["message"], case["divisor"]) == case["total_tokens"]


# --------------------------------------------------------------------------- truncate_text_output


@pytest.mark.parametrize("case", VECTORS["truncate_text_output"], ids=lambda case: case["id"])
def test_it_truncates_text_like_reme(case: dict[str, Any]) -> None:
    given_input = case["input"]
    assert len(given_input["text"].encode("utf-8")) == given_input.get(
        "text_bytes", len(given_input["text"].encode("utf-8"))
    )
    arguments = {
        key: given_input[key]
        for key in ("start_line", "total_lines", "max_bytes", "file_path")
        if key in given_input
    }
    if case["function"] == "_truncate_fresh":
        actual = copaw._truncate_fresh(
            given_input["text"],
            given_input["start_line"],
            given_input["total_lines"],
            given_input["max_bytes"],
            given_input["file_path"],
        )
    else:
        assert case["function"] == "truncate_text_output"
        actual = copaw.truncate_text_output(given_input["text"], **arguments)
    _assert_output_matches(actual, case["output"])


# --------------------------------------------------------------------------- tool_result_compactor


@pytest.mark.parametrize("case", VECTORS["tool_result_compactor"], ids=lambda case: case["id"])
def test_it_compacts_tool_results_like_reme(
    case: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = UuidSpy()
    monkeypatch.setattr(copaw, "uuid4", spy)
    directory = tmp_path / "tool_result"
    messages: list[dict[str, Any]] = copy.deepcopy(case["input_messages"])

    for pass_number, expected_pass in enumerate(case["passes"], start=1):
        if pass_number > 1:
            appended = APPENDED_BEFORE_PASS.get((case["id"], pass_number))
            assert appended is not None, f"{case['id']}: no reconstruction of {case.get('between_passes')!r}"
            messages = messages + copy.deepcopy(appended)
        expected_indices = {output["msg_index"] for output in expected_pass["outputs"]}
        assert max(expected_indices) == len(messages) - 1, (
            "the reconstructed conversation has the wrong length"
        )

        before = copy.deepcopy(messages)
        result = copaw.compact_tool_results(
            messages,
            recent_n=case["params"]["recent_n"],
            old_max_bytes=case["params"]["old_max_bytes"],
            recent_max_bytes=case["params"]["recent_max_bytes"],
            tool_result_dir=directory,
        )
        assert messages == before, "the caller's messages were changed"
        assert len(result) == len(messages)

        for expected in expected_pass["outputs"]:
            message = result[expected["msg_index"]]
            if "string_content" in expected:
                assert message["content"] == expected["string_content"]
                continue
            output = _tool_result_block(message, expected["id"])["output"]
            assert isinstance(output, str)
            _assert_output_matches(spy.normalise(output, directory), expected["output"])
        for index, message in enumerate(result):
            if index not in expected_indices:
                assert message == messages[index], f"message {index} is not in the vector but changed"

        saved = sorted(directory.glob("*")) if directory.exists() else []
        assert sorted(spy.placeholder(path.name) for path in saved) == sorted(
            f["name"] for f in expected_pass["saved_files"]
        )
        for expected_file in expected_pass["saved_files"]:
            number = int(re.fullmatch(r"<UUID(\d+)>\.txt", expected_file["name"]).group(1))  # type: ignore[union-attr]
            data = (directory / f"{spy.drawn[number - 1]}.txt").read_bytes()
            assert len(data) == expected_file["bytes"]
            assert hashlib.sha256(data).hexdigest() == expected_file["sha256"]
            if "content" in expected_file:
                assert data.decode("utf-8") == expected_file["content"]

        messages = result


# --------------------------------------------------------------------------- context_check


@pytest.mark.parametrize("case", VECTORS["context_check"], ids=lambda case: case["id"])
def test_it_splits_context_like_reme(case: dict[str, Any]) -> None:
    messages = case["messages"]
    divisor = case["divisor"]
    tokens = [copaw.estimate_message_tokens(message, divisor) for message in messages]
    assert tokens == case["per_message_tokens"]
    assert sum(tokens) == case["total_tokens"]

    compact, keep, is_valid = copaw.context_check(
        messages, threshold=case["threshold"], reserve=case["reserve"], divisor=divisor
    )
    assert compact == case["compact_indices"]
    assert keep == case["keep_indices"]
    assert sum(tokens[index] for index in keep) == case["kept_tokens"]
    assert is_valid is case["is_valid"]

    guarded = copaw.check_context(
        messages, threshold=case["threshold"], reserve=case["reserve"], divisor=divisor
    )
    if case["threshold"] > case["reserve"]:
        assert guarded == (compact, keep, is_valid)
    else:
        # The vectors call AsMsgHandler.context_check directly; ReMeLight.check_context would have
        # tripped ContextChecker's `threshold > reserve` assertion and compacted nothing.
        assert guarded == ([], list(range(len(messages))), False)


def test_it_compacts_nothing_when_the_threshold_does_not_exceed_the_reserve() -> None:
    messages = [_message("user", "word " * 400), _message("assistant", "word " * 400)]
    assert copaw.check_context(messages, threshold=10, reserve=10) == ([], [0, 1], False)
    assert copaw.check_context(messages, threshold=10, reserve=20) == ([], [0, 1], False)
    assert copaw.check_context([], threshold=10, reserve=20) == ([], [], False)
    assert copaw.check_context(messages, threshold=11, reserve=10) == ([0, 1], [], True)


def test_it_charges_the_tool_use_message_a_kept_result_pulls_in() -> None:
    call = _message("assistant", [{"type": "tool_use", "id": "a", "name": "t", "input": {"q": "x" * 100}}])
    result = _message("system", [{"type": "tool_result", "id": "a", "name": "t", "output": "y" * 40}])
    messages = [_message("user", "q" * 40), call, result, _message("user", "z" * 40)]
    assert [copaw.estimate_message_tokens(message) for message in messages] == [11, 29, 11, 11]
    # The result alone would fit (11 + 11 <= 40), but not with its 29-token call: stop there.
    assert copaw.context_check(messages, threshold=10, reserve=40) == ([0, 1, 2], [3], True)
    assert copaw.context_check(messages, threshold=10, reserve=60) == ([0], [1, 2, 3], True)

    # Two results in one message answering one call message: the call is charged once per result
    # (2 + 2 + 22 = 26 tokens, not 24).
    calls = _message(
        "assistant",
        [{"type": "tool_use", "id": i, "name": "t", "input": {}} for i in ("a", "b")],
    )
    results = _message(
        "system",
        [{"type": "tool_result", "id": i, "name": "t", "output": "y" * 40} for i in ("a", "b")],
    )
    messages = [_message("user", "q" * 400), calls, results]
    assert copaw.context_check(messages, threshold=10, reserve=25) == ([0, 1, 2], [], True)
    assert copaw.context_check(messages, threshold=10, reserve=26) == ([0], [1, 2], True)


def test_it_keeps_a_non_contiguous_set_for_parallel_calls() -> None:
    # Parallel calls X and Y, a big result for Y, then a small one for X (the reference's C09).
    messages = [
        _message("user", "go"),
        _message(
            "assistant",
            [
                {"type": "tool_use", "id": "x", "name": "t", "input": {}},
                {"type": "tool_use", "id": "y", "name": "t", "input": {}},
            ],
        ),
        _message("system", [{"type": "tool_result", "id": "y", "name": "t", "output": "y" * 1000}]),
        _message("system", [{"type": "tool_result", "id": "x", "name": "t", "output": "x" * 40}]),
    ]
    assert copaw.context_check(messages, threshold=100, reserve=60) == ([0, 2], [1, 3], False)
    # CoPaw then ignores the split and the budget: the last 3 messages align, so the 267-token
    # result is kept with a 60-token reserve.
    assert copaw.copaw_fallback_keep(messages) == 3


def test_it_falls_back_to_fewer_messages_until_tool_ids_align() -> None:
    pending = _message("assistant", [{"type": "tool_use", "id": "p", "name": "t", "input": {}}])
    result = _message("system", [{"type": "tool_result", "id": "p", "name": "t", "output": "done"}])
    assert copaw.copaw_fallback_keep([_message("user", "q"), pending]) == 0
    assert copaw.copaw_fallback_keep([_message("user", "q"), pending, result, _message("user", "a")]) == 3
    assert copaw.copaw_fallback_keep([pending, result, _message("user", "a"), _message("user", "b")]) == 2


# --------------------------------------------------------------------------- properties


def _all_vector_messages() -> list[dict[str, Any]]:
    messages = [message for case in VECTORS["tool_result_compactor"] for message in case["input_messages"]]
    messages += [message for case in VECTORS["context_check"] for message in case["messages"]]
    return messages + [case["message"] for case in MESSAGE_TOKEN_CASES]


def test_it_never_mutates_its_input(tmp_path: Path) -> None:
    for case in VECTORS["tool_result_compactor"]:
        messages = copy.deepcopy(case["input_messages"])
        snapshot = copy.deepcopy(messages)
        result = copaw.compact_tool_results(
            messages, recent_n=1, old_max_bytes=50, recent_max_bytes=100, tool_result_dir=tmp_path
        )
        assert messages == snapshot
        assert all(new is not old for new, old in zip(result, messages, strict=True))
        # What was cut lives in new lists and blocks; what was not is shared, read-only.
        for new, old in zip(result, messages, strict=True):
            if new["content"] != old["content"]:
                assert new["content"] is not old["content"]
                for new_block, old_block in zip(new["content"], old["content"], strict=True):
                    assert (new_block is old_block) == (new_block == old_block)
            new["content"] = "changed"
        assert messages == snapshot

    messages = _all_vector_messages()
    snapshot = copy.deepcopy(messages)
    copaw.context_check(messages, threshold=1, reserve=50)
    copaw.format_messages_for_summary(messages, cap_tokens=100)
    copaw.copaw_fallback_keep(messages)
    assert messages == snapshot


def test_it_compacts_list_outputs_block_by_block(tmp_path: Path) -> None:
    image = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    messages = [
        _message("assistant", [{"type": "tool_use", "id": "v", "name": "view", "input": {}}]),
        _message(
            "system",
            [
                {
                    "type": "tool_result",
                    "id": "v",
                    "name": "view",
                    "output": [
                        {"type": "text", "text": "a\n" * 300},
                        image,
                        {"type": "text", "text": "short"},
                        {"type": "text", "text": "b\n" * 300},
                    ],
                }
            ],
        ),
    ]
    result = copaw.compact_tool_results(
        messages, recent_n=1, old_max_bytes=10, recent_max_bytes=100, tool_result_dir=tmp_path
    )
    first, kept_image, short, last = result[1]["content"][0]["output"]
    assert first["text"].startswith("a\n" * 50 + MARKER)
    assert kept_image is image
    assert short["text"] == "short"
    assert last["text"].startswith("b\n" * 50 + MARKER)
    assert sorted(path.read_text() for path in tmp_path.iterdir()) == ["a\n" * 300, "b\n" * 300]


def test_it_leaves_string_contents_and_empty_outputs_alone(tmp_path: Path) -> None:
    messages = [
        _message("user", "x" * 5000),
        _message("system", [{"type": "tool_result", "id": "e", "name": "t", "output": ""}]),
    ]
    result = copaw.compact_tool_results(
        messages, recent_n=0, old_max_bytes=10, recent_max_bytes=10, tool_result_dir=tmp_path
    )
    assert result == messages
    assert not list(tmp_path.iterdir())


line_texts = st.lists(
    st.text(alphabet=st.sampled_from("ab \t中文é😀"), max_size=40), min_size=2, max_size=30
).map(lambda lines: "\n".join(lines) + "\n")


@settings(max_examples=200, deadline=None)
@given(text=line_texts, first=st.integers(1, 400), second=st.integers(1, 400))
def test_it_keeps_the_file_path_when_retruncating(text: str, first: int, second: int) -> None:
    path = "/ws/tool_result/0123456789abcdef0123456789abcdef.txt"
    once = copaw.truncate_text_output(text, 1, text.count("\n") + 1, first, file_path=path)
    twice = copaw.truncate_text_output(once, max_bytes=second)
    if MARKER in once:
        assert (MARKER in twice) and f"file_path={path} start_line=" in twice
        before, after = _parse_notice(once), _parse_notice(twice)
        assert before is not None and after is not None
        for unchanged in ("file_path", "total_lines", "starts_at_line"):
            assert after[unchanged] == before[unchanged]
        assert once.split(MARKER, 1)[0].startswith(twice.split(MARKER, 1)[0])


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet=st.sampled_from("ab\n中文é😀"), min_size=1, max_size=200),
    max_bytes=st.integers(1, 300),
)
def test_it_never_leaves_a_broken_utf8_sequence(text: str, max_bytes: int) -> None:
    fresh = copaw.truncate_text_output(text, 1, text.count("\n") + 1, max_bytes, file_path="/f.txt")
    silent = copaw.truncate_text_output(text, 1, 1, max_bytes)
    again = copaw.truncate_text_output(fresh, max_bytes=max(1, max_bytes // 3))
    for cut in (fresh, silent, again):
        # Whole characters of the original, in order: no U+FFFD, no half of a multi-byte sequence.
        assert text.startswith(cut.split(MARKER, 1)[0])
    for cut in (fresh, silent):
        excerpt = cut.split(MARKER, 1)[0]
        if excerpt != text:
            assert max_bytes - 3 <= len(excerpt.encode("utf-8")) <= max_bytes


# --------------------------------------------------------------------------- summary text and arithmetic


def test_it_formats_messages_for_the_summariser() -> None:
    notice_output = copaw.truncate_text_output("L\n" * 100, 1, 101, 10, file_path="/tmp/x.txt")
    messages = [
        {"name": "", "role": "user", "timestamp": "", "content": "first\nquestion"},
        _message(
            "assistant",
            [
                {"type": "thinking", "thinking": "hmm"},
                {"type": "text", "text": ""},
                {"type": "tool_use", "id": "c", "name": "shell", "input": {"cmd": "ls é"}},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
            ],
        ),
        _message("system", [{"type": "tool_result", "id": "c", "name": "shell", "output": notice_output}]),
        _message("assistant", "z" * 1500),
    ]
    formatted = copaw.format_messages_for_summary(messages, cap_tokens=10_000)
    assert formatted == "\n\n".join(
        [
            "user:\n[text]: first question",
            f'[{FIXED_TIMESTAMP}] assistant:\n[think]: hmm\n[tool_use]: shell params={{"cmd": "ls é"}}\n[image]: ',
            f"[{FIXED_TIMESTAMP}] system:\n[tool_result]: shell output=L L L L L ",
            f"[{FIXED_TIMESTAMP}] assistant:\n[text]: {'z' * 1000}...",
        ]
    )
    assert "[think]" not in copaw.format_messages_for_summary(
        messages, cap_tokens=10_000, include_thinking=False
    )
    # Newest first under the cap; the newest message is kept even when it alone is over.
    assert (
        copaw.format_messages_for_summary(messages, cap_tokens=1)
        == f"[{FIXED_TIMESTAMP}] assistant:\n[text]: {'z' * 1000}..."
    )
    newest_two = copaw.format_messages_for_summary(messages, cap_tokens=300)
    assert newest_two.startswith(f"[{FIXED_TIMESTAMP}] system:")
    assert copaw.format_messages_for_summary([], cap_tokens=10) == ""


def test_it_checks_summaries_and_wraps_them() -> None:
    assert copaw.is_valid_summary("## Goal\nship it")
    assert copaw.is_valid_summary("x##y")
    assert not copaw.is_valid_summary("# only h1")
    assert not copaw.is_valid_summary("   \n")
    assert copaw.wrap_summary("## Goal\nship") == (
        "# Summary of previous conversation\n\n"
        "Previous conversation logs are offloaded to dialog/YYYY-MM-DD.jsonl (or nearby date files). "
        "Here is the summary:\n\n## Goal\nship\n"
        "The above is a summary of previous conversation, use it as context to maintain continuity."
    )


def test_it_computes_copaw_and_reme_thresholds() -> None:
    assert copaw.calculate_threshold(131072, 0.75) == 98304
    assert copaw.calculate_reserve(131072, 0.1) == 13107
    assert copaw.reme_threshold(131072, 0.7) == 87162
    assert copaw.reme_threshold(131072, 0.75) == 93388


def test_it_dates_dialog_files_from_the_timestamp() -> None:
    assert copaw.dialog_date_for("2026-03-19 23:59:59.900") == "2026-03-19"
    assert copaw.dialog_date_for("2026-03-20 00:00:00.100") == "2026-03-20"
    assert copaw.dialog_date_for("") == date.today().isoformat()


def test_it_deletes_only_expired_txt_files(tmp_path: Path) -> None:
    now = datetime(2026, 3, 20, 12, 0, 0)
    for name, age in (
        ("old.txt", timedelta(days=6)),
        ("new.txt", timedelta(days=4)),
        ("old.json", timedelta(days=9)),
    ):
        path = tmp_path / name
        path.write_text("x")
        stamp = (now - age).timestamp()
        os.utime(path, (stamp, stamp))
    assert copaw.cleanup_expired_files(tmp_path, 5, now=now) == 1
    assert sorted(path.name for path in tmp_path.iterdir()) == ["new.txt", "old.json"]
    assert copaw.cleanup_expired_files(tmp_path / "missing", 5, now=now) == 0
