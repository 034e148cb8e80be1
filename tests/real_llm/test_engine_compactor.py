"""The engine's OpenAI-compatible compactor against a real llama-server.

Each test makes one or two calls. The assertions are about the exchange the
server saw and about what the engine did with the real reply; the reply's
wording is never judged, only its verdict, which is computed from the reply
the server actually sent.
"""

from __future__ import annotations

import json

from contextlab.engine.compactors.base import SummaryFailed, SummaryRequest
from contextlab.engine.compactors.constrained import summary_grammar
from contextlab.engine.compactors.openai_compat import OpenAICompactor
from contextlab.engine.core.profile import Profile
from contextlab.engine.hook import ContextManager
from contextlab.engine.stages.summary.prompts import (
    SECTION_HEADINGS,
    SUBSECTION_HEADINGS,
    build_summary_messages,
)
from contextlab.engine.stages.summary.validity import check_summary, normalize_summary
from tests.engine.sessions import assistant, tool_round, user
from tests.real_llm.server import CONTEXT_TOKENS, PREDICT_TOKENS, RecordingProxy

# A CPU-only server on a busy 2-core machine can take minutes for one prompt.
TIMEOUT = 300.0
# A 3,000-token window: the summariser reads at most 1,800 tokens of transcript,
# so a call stays well inside the server's context.
PROFILE = Profile(max_input_length=3_000, compact_ratio=0.5, reserve_ratio=0.05, recent_n=2,
                  recent_max_bytes=6_000, old_max_bytes=600)


def _compactor(llm: RecordingProxy, **kw) -> OpenAICompactor:
    kw.setdefault("retries", 0)
    return OpenAICompactor(llm.base_url, "smollm2", api_key_env="", timeout=TIMEOUT, retry_backoff=0, **kw)


def _request() -> SummaryRequest:
    messages = [user("The nightly build of /srv/app fails in module_7.c; fix it without touching the tests."),
                *tool_round("run_shell", {"command": "make -C /srv/app"},
                            ["module_7.c:42: error: 'count' undeclared (first use in this function)"]),
                assistant("The variable is declared inside the loop; I will move it up.")]
    return SummaryRequest(messages, None, "en")


def _work(manager: ContextManager, turns: int, words: int) -> None:
    for i in range(turns):
        manager.append([user(f"Step {i}: rebuild target t{i} and report the errors. " + "detail " * words),
                        assistant(f"Target t{i} rebuilt; errors are listed in /srv/app/t{i}.log. " + "note " * words)])


def test_it_sends_the_summary_request_and_returns_the_servers_reply_with_usage_and_latency(llm):
    request = _request()
    result = _compactor(llm, max_tokens=48).summarize(request)

    [exchange] = llm.completions
    assert exchange.path == "/v1/chat/completions" and exchange.status == 200
    assert exchange.body is not None
    assert exchange.body["messages"] == build_summary_messages(request)
    assert exchange.body["max_tokens"] == 48
    assert not exchange.body.get("stream", False)
    assert exchange.body["temperature"] == 0.2
    # What the compactor returns is the server's reply, with its own figures.
    assert exchange.content is not None
    assert result.text == normalize_summary(exchange.content)
    assert result.usage == {k: exchange.usage[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    assert 0 < result.usage["completion_tokens"] <= 48
    assert result.usage["prompt_tokens"] > 100  # the whole template and transcript were read
    assert result.latency_ms >= exchange.seconds * 1000 * 0.9
    assert result.attempts == 1 and result.attempt_errors == []
    assert result.raw_response == exchange.response


def test_it_leaves_the_reply_length_to_the_server_when_no_max_tokens_is_set(llm):
    result = _compactor(llm).summarize(_request())
    [exchange] = llm.completions
    assert exchange.body is not None and "max_tokens" not in exchange.body
    assert result.usage is not None and result.usage["completion_tokens"] <= PREDICT_TOKENS
    if exchange.finish_reason == "length":
        assert result.usage["completion_tokens"] == PREDICT_TOKENS


def test_it_judges_a_reply_cut_at_max_tokens_invalid_keeps_everything_and_saves_the_raw_reply(llm, tmp_path):
    # Eight tokens cannot hold six headings: the real reply is cut, whatever the model writes.
    manager = ContextManager(PROFILE, tmp_path / "ws", system_prompt="You are a build agent.",
                             compactor=_compactor(llm, max_tokens=8))
    manager.summary = "## Goal\n- the previous summary, kept on failure"
    _work(manager, turns=4, words=220)  # over the threshold, under the window
    live_before = manager.live_ids()
    assert manager.live_tokens < PROFILE.max_input_length  # no overflow: no fallback
    turn = manager.prepare()

    [exchange] = llm.completions
    assert exchange.finish_reason == "length" and exchange.usage is not None
    assert exchange.usage["completion_tokens"] == 8
    verdict = check_summary(exchange.content, language="en")
    assert not verdict.valid
    assert turn.trace.outcome == "compaction_failed"
    assert manager.summary == "## Goal\n- the previous summary, kept on failure"
    assert manager.live_ids() == live_before and not manager.archived_ids
    validity = turn.trace.get("validity")
    assert validity is not None and validity.status == "failed"
    assert validity.reasons == verdict.reasons
    saved = json.loads((manager.workspace / validity.details["saved"]).read_text(encoding="utf-8"))
    assert saved["response"] == exchange.response
    assert saved["request"]["body"]["messages"] == exchange.body["messages"]
    summary = turn.trace.get("summary")
    assert summary is not None and summary.details["usage"]["completion_tokens"] == 8
    assert summary.numbers["latency_ms"] >= round(exchange.seconds * 1000 * 0.9, 1)


def test_it_uses_the_extractive_fallback_only_when_keeping_everything_would_overflow(llm, tmp_path):
    manager = ContextManager(PROFILE, tmp_path / "ws", system_prompt="You are a build agent.",
                             compactor=_compactor(llm, max_tokens=8))
    _work(manager, turns=5, words=300)
    assert manager.live_tokens > PROFILE.max_input_length
    turn = manager.prepare()

    [exchange] = llm.completions
    assert not check_summary(exchange.content, language="en").valid
    assert turn.trace.outcome == "fallback_summary"
    assert manager.summaries[-1].fallback and manager.summaries[-1].compactor == "extractive"
    assert check_summary(manager.summary, language="en").valid
    validity = turn.trace.get("validity")
    assert validity is not None and (manager.workspace / validity.details["saved"]).is_file()


def test_it_reports_the_servers_context_limit_without_retrying(llm):
    words = "context " * (CONTEXT_TOKENS * 2)
    request = SummaryRequest([user("Summarise this: " + words)], None, "en")
    compactor = _compactor(llm, retries=2, max_chars_per_block=len(words) + 100)
    try:
        compactor.summarize(request)
    except SummaryFailed as exc:
        failure = exc
    else:
        raise AssertionError("a prompt twice the server's context must be refused")
    [exchange] = llm.completions  # a 4xx is not retried
    assert exchange.status == 400
    assert failure.attempts == 1
    assert failure.raw_response is not None and failure.raw_response["status_code"] == 400
    assert "HTTP 400" in failure.message


def test_it_gets_a_reply_in_the_template_shape_when_the_server_applies_the_grammar(llm):
    result = _compactor(llm, constrained_output="grammar").summarize(_request())
    [exchange] = llm.completions
    assert exchange.body is not None and exchange.body["grammar"] == summary_grammar("en")
    content = exchange.content or ""
    # The server followed the grammar: headings in the template's order, bullets under them.
    headings = SECTION_HEADINGS["en"][:3] + SUBSECTION_HEADINGS["en"] + SECTION_HEADINGS["en"][3:]
    seen = [line for line in content.split("\n") if line.startswith("#")]
    assert seen == list(headings[:len(seen)]) and seen
    lines = content.split("\n")
    if exchange.finish_reason == "length":
        # A reply cut at the token limit ends inside a line the grammar allows: a bare "-" is one.
        cut = lines.pop()
        assert cut == "" or cut.startswith(("#", "- ")) or "- ".startswith(cut), cut
    assert all(line == "" or line.startswith(("#", "- ")) for line in lines), content
    # Only a finished grammar lets the server stop on its own, and a finished grammar is a valid
    # summary; a reply cut at the token limit can be valid only if every heading came before the cut.
    verdict = check_summary(result.text, language="en")
    if exchange.finish_reason == "stop":
        assert verdict.valid
    else:
        assert exchange.finish_reason == "length"
        assert not verdict.valid or len(seen) == len(headings)


def test_it_renders_a_json_schema_reply_and_passes_a_cut_one_on_to_the_check(llm):
    result = _compactor(llm, constrained_output="json_schema").summarize(_request())
    [exchange] = llm.completions
    assert exchange.body is not None and exchange.body["response_format"]["type"] == "json_schema"
    try:
        parsed = json.loads(exchange.content or "")
    except ValueError:
        parsed = None
    verdict = check_summary(result.text, language="en")
    if exchange.finish_reason == "stop":
        assert isinstance(parsed, dict) and verdict.valid
    else:
        assert parsed is None and result.text == normalize_summary(exchange.content or "")
        assert not verdict.valid
