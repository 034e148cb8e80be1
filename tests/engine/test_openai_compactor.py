"""The OpenAI compactor against a real local HTTP server (tests/fakellm.py)."""

from __future__ import annotations

import socket
import time

import pytest

from contextlab.engine.compactors import build_compactor
from contextlab.engine.compactors.base import Compactor, SummaryFailed, SummaryRequest
from contextlab.engine.compactors.openai_compat import OpenAICompactor
from contextlab.engine.core.errors import CompactorFailed, InvalidProfile
from contextlab.engine.core.messages import Message, TextBlock, ToolResultBlock, ToolUseBlock
from contextlab.engine.stages.summary.prompts import SECTION_HEADINGS, SUBSECTION_HEADINGS
from contextlab.engine.stages.summary.validity import check_summary
from tests.fakellm import FakeLLM, Reply, Sleep, Status

KEY_ENV = "CONTEXTLAB_TEST_LLM_KEY"

VALID = """\
## Goal
- Fix the failing test in `src/app/models.py`.

## Constraints & Preferences
- Don't change the tests.

## Progress
### Done
- [x] Fixed the off-by-one in `count_items`.
### In Progress
- (none)
### Blocked
- (none)

## Key Decisions
- Use `len(cart.items)`.

## Next Steps
1. Run `pytest -q`.

## Critical Context
- `AssertionError: expected 3 got 2`"""


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, "sk-test-123")


def _session() -> list[Message]:
    return [
        Message.text(
            "user", "Please fix the failing test in src/app/models.py.", timestamp="2026-03-19T10:00:00.000Z"
        ),
        Message(
            role="assistant",
            timestamp="2026-03-19T10:00:01.000Z",
            content=(ToolUseBlock("c1", "run_shell", {"command": "pytest -q"}),),
        ),
        Message(
            role="tool",
            timestamp="2026-03-19T10:00:02.000Z",
            content=(
                ToolResultBlock("c1", "run_shell", "E   AssertionError: expected 3 got 2", is_error=True),
            ),
        ),
        Message(role="assistant", timestamp="2026-03-19T10:00:03.000Z", content=(TextBlock("Found it."),)),
    ]


def _compactor(llm: FakeLLM, **kw) -> OpenAICompactor:
    kw.setdefault("retry_backoff", 0)
    return OpenAICompactor(llm.base_url, "cheap-model", api_key_env=KEY_ENV, **kw)


def test_it_summarises_and_records_the_call():
    with FakeLLM([Reply(VALID)]) as llm:
        compactor = _compactor(llm)
        assert isinstance(compactor, Compactor)
        result = compactor.summarize(SummaryRequest(_session(), None, "en"))
    assert result.text == VALID
    assert check_summary(result.text, language="en").valid
    assert result.compactor == "openai"
    assert result.model == "fake-model-2026"
    assert result.usage == {"prompt_tokens": 321, "completion_tokens": 54, "total_tokens": 375}
    assert result.attempts == 1 and result.attempt_errors == []
    assert result.latency_ms > 0
    assert (
        result.raw_response is not None and result.raw_response["choices"][0]["message"]["content"] == VALID
    )
    # The recorded request is exactly what went over the wire.
    [sent] = llm.requests
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == "Bearer sk-test-123"
    assert result.raw_request is not None
    assert result.raw_request["body"]["messages"] == sent.body["messages"]
    assert sent.body["model"] == "cheap-model"
    assert sent.body["temperature"] == 0.2
    assert "sk-test-123" not in str(result.raw_request)


def test_it_sends_the_conversation_and_the_chosen_language_headings():
    with FakeLLM([Reply(VALID)]) as llm:
        _compactor(llm).summarize(SummaryRequest(_session(), None, "en"))
    [sent] = llm.requests
    assert [m["role"] for m in sent.body["messages"]] == ["system", "user"]
    user = sent.user_text
    assert "Please fix the failing test in src/app/models.py." in user
    assert 'tool_use run_shell({"command": "pytest -q"})' in user
    assert "E   AssertionError: expected 3 got 2" in user
    for heading in SECTION_HEADINGS["en"] + SUBSECTION_HEADINGS["en"]:
        assert heading in user
    assert "<previous_summary>" not in user


def test_it_sends_the_previous_summary_and_the_extra_instruction():
    previous = "## Goal\n- Keep `src/app/models.py` green.\n## Critical Context\n- `PORT=8042`"
    request = SummaryRequest(_session(), previous, "en", extra_instruction="Mention every port number.")
    with FakeLLM([Reply(VALID)]) as llm:
        _compactor(llm).summarize(request)
    user = llm.requests[0].user_text
    assert f"<previous_summary>\n{previous}\n</previous_summary>" in user
    assert "Mention every port number." in user
    assert "ONE merged summary" in user


def test_it_asks_in_chinese_for_a_chinese_session():
    messages = [Message.text("user", "请修复 src/app/models.py 里的计数错误，不要修改测试。")]
    with FakeLLM([Reply(VALID.replace("## Goal", "## 目标"))]) as llm:
        _compactor(llm).summarize(SummaryRequest(messages, None, "auto"))
    sent = llm.requests[0]
    for heading in SECTION_HEADINGS["zh"] + SUBSECTION_HEADINGS["zh"]:
        assert heading in sent.user_text
    assert "## Goal" not in sent.user_text
    assert "绝不编造" in sent.system_text


def test_it_returns_a_reply_without_headings_for_the_validity_check_to_reject():
    with FakeLLM([Reply("The user wanted a fix and it was done.")]) as llm:
        result = _compactor(llm).summarize(SummaryRequest(_session(), None, "en"))
    assert result.text == "The user wanted a fix and it was done."
    assert result.attempts == 1
    verdict = check_summary(result.text, language="en")
    assert not verdict.valid and verdict.reasons == ["the reply has no Markdown headings"]
    assert result.raw_response is not None and result.raw_request is not None


def test_it_unwraps_a_fenced_reply():
    with FakeLLM([Reply(f"<think>ok</think>\n```markdown\n{VALID}\n```")]) as llm:
        result = _compactor(llm).summarize(SummaryRequest(_session(), None, "en"))
    assert result.text == VALID


def test_it_retries_an_empty_reply_then_fails():
    with FakeLLM([Reply("   ")]) as llm, pytest.raises(SummaryFailed) as caught:
        _compactor(llm, retries=2).summarize(SummaryRequest(_session(), None, "en"))
    exc = caught.value
    assert isinstance(exc, CompactorFailed)
    assert len(llm.requests) == 3 and exc.attempts == 3
    assert "empty summary" in exc.message and "after 3 attempts" in exc.message
    assert exc.raw_request is not None and exc.raw_request["body"]["messages"][0]["role"] == "system"
    assert exc.raw_response is not None and exc.raw_response["choices"][0]["message"]["content"] == "   "
    assert exc.debug_record()["attempt_errors"] == [
        f"attempt {n}: the model answered with an empty summary (finish_reason=stop)" for n in (1, 2, 3)
    ]


def test_it_fails_on_an_absent_answer():
    with FakeLLM([Reply(None)]) as llm, pytest.raises(SummaryFailed, match="empty summary"):
        _compactor(llm, retries=0).summarize(SummaryRequest(_session(), None, "en"))
    assert len(llm.requests) == 1


def test_it_gives_up_after_timeouts():
    with FakeLLM([Sleep(10)]) as llm:
        started = time.monotonic()
        with pytest.raises(SummaryFailed) as caught:
            _compactor(llm, timeout=0.3, retries=1).summarize(SummaryRequest(_session(), None, "en"))
        elapsed = time.monotonic() - started
    assert elapsed < 5
    assert len(llm.requests) == 2 and caught.value.attempts == 2
    assert "no answer within the 0.3 s timeout" in caught.value.message
    assert caught.value.raw_response is None


def test_it_counts_a_retry_after_a_server_error():
    with FakeLLM([Status(500, "overloaded"), Reply(VALID)]) as llm:
        result = _compactor(llm, retries=2).summarize(SummaryRequest(_session(), None, "en"))
    assert result.text == VALID
    assert result.attempts == 2 and len(llm.requests) == 2
    assert len(result.attempt_errors) == 1
    assert result.attempt_errors[0].startswith("attempt 1: HTTP 500 from ")
    assert "overloaded" in result.attempt_errors[0]
    # Both attempts sent the same request.
    assert llm.requests[0].body == llm.requests[1].body


def test_it_does_not_retry_an_authentication_error():
    with FakeLLM([Status(401, "Incorrect API key provided")]) as llm, pytest.raises(SummaryFailed) as caught:
        _compactor(llm, retries=3).summarize(SummaryRequest(_session(), None, "en"))
    exc = caught.value
    assert len(llm.requests) == 1 and exc.attempts == 1
    assert "HTTP 401" in exc.message and "Incorrect API key provided" in exc.message
    # The SDK hands over the "error" object of the body.
    assert exc.raw_response == {
        "status_code": 401,
        "body": {"message": "Incorrect API key provided", "type": "scripted", "code": "401"},
    }


def test_it_reports_a_server_that_is_not_there():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    compactor = OpenAICompactor(
        f"http://127.0.0.1:{port}/v1", "m", api_key_env=KEY_ENV, retries=1, retry_backoff=0
    )
    with pytest.raises(SummaryFailed, match="could not reach") as caught:
        compactor.summarize(SummaryRequest(_session(), None, "en"))
    assert caught.value.attempts == 2


def test_it_needs_the_api_key_variable(monkeypatch):
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(CompactorFailed, match=f"environment variable {KEY_ENV} is not set") as caught:
        OpenAICompactor("http://127.0.0.1:9/v1", "m", api_key_env=KEY_ENV)
    assert caught.value.field == "api_key_env"


def test_it_needs_no_key_for_an_endpoint_without_authentication():
    with FakeLLM([Reply(VALID)]) as llm:
        OpenAICompactor(llm.base_url, "local", api_key_env=None, retry_backoff=0).summarize(
            SummaryRequest(_session(), None, "en")
        )
    assert llm.requests[0].headers["authorization"] == "Bearer not-needed"


def test_it_needs_a_model_name():
    with pytest.raises(InvalidProfile, match="needs a model name"):
        OpenAICompactor("http://127.0.0.1:9/v1", " ", api_key_env=KEY_ENV)


def test_it_is_built_by_the_factory():
    with FakeLLM([Reply(VALID)]) as llm:
        compactor = build_compactor(
            "openai", base_url=llm.base_url, model="cheap-model", api_key_env=KEY_ENV, timeout=5.0, retries=0
        )
        assert isinstance(compactor, OpenAICompactor)
        assert compactor.label == f"cheap-model via {llm.base_url.split('/')[2]} (OpenAI-compatible)"
        assert compactor.summarize(SummaryRequest(_session(), None, "en")).attempts == 1
    with pytest.raises(InvalidProfile, match="unknown compactor 'gpt'"):
        build_compactor("gpt")
    with pytest.raises(InvalidProfile, match="takes no options"):
        build_compactor("extractive", model="x")
