"""The openai compactor's constrained-output option and reply bound, against the local fake server.

Whether a real server accepts the grammar and the schema is tests/real_llm's job.
"""

from __future__ import annotations

import json

import pytest

from contextlab.engine.compactors.base import SummaryRequest
from contextlab.engine.compactors.constrained import render_json_summary, summary_grammar, summary_schema
from contextlab.engine.compactors.openai_compat import OpenAICompactor
from contextlab.engine.core.errors import InvalidProfile
from contextlab.engine.core.messages import Message
from contextlab.engine.core.profile import Profile
from contextlab.engine.hook import ContextManager
from contextlab.engine.stages.summary.prompts import (
    SECTION_HEADINGS,
    SECTION_IDS,
    SUBSECTION_HEADINGS,
    SUBSECTION_IDS,
)
from contextlab.engine.stages.summary.validity import check_summary
from tests.fakellm import FakeLLM, Reply

REQUEST = SummaryRequest([Message.text("user", "Fix the build in /srv/app.", timestamp="2026-03-19T10:00:00.000Z")],
                         None, "en")


def _compactor(llm: FakeLLM, **kw) -> OpenAICompactor:
    return OpenAICompactor(llm.base_url, "small-model", api_key_env="", retries=0, retry_backoff=0, **kw)


def _json_reply(**override) -> str:
    data: dict = {sid: [f"{sid} item"] for sid in SECTION_IDS}
    data["progress"] = {sub: [f"{sub} item"] for sub in SUBSECTION_IDS}
    data.update(override)
    return json.dumps(data)


def test_it_sends_neither_a_constraint_nor_max_tokens_by_default():
    with FakeLLM([Reply("## Goal\n- x")]) as llm:
        _compactor(llm).summarize(REQUEST)
    [sent] = llm.requests
    assert "grammar" not in sent.body and "response_format" not in sent.body and "max_tokens" not in sent.body


def test_it_sends_the_grammar_and_max_tokens_and_records_them_in_the_raw_request():
    with FakeLLM([Reply("## Goal\n- x")]) as llm:
        result = _compactor(llm, constrained_output="grammar", max_tokens=300).summarize(REQUEST)
    [sent] = llm.requests
    assert sent.body["grammar"] == summary_grammar("en")
    assert sent.body["max_tokens"] == 300
    assert result.raw_request is not None
    assert result.raw_request["body"]["grammar"] == sent.body["grammar"]
    assert result.raw_request["body"]["max_tokens"] == 300


def test_it_writes_every_heading_of_the_language_into_the_grammar_in_order():
    for language in ("en", "zh"):
        grammar = summary_grammar(language)
        headings = SECTION_HEADINGS[language][:3] + SUBSECTION_HEADINGS[language] + SECTION_HEADINGS[language][3:]
        positions = [grammar.index(json.dumps(h + "\n", ensure_ascii=False)) for h in headings]
        assert positions == sorted(positions)
        assert grammar.startswith("root ::= section0 section1 section2 section3 section4 section5\n")


def test_it_asks_for_the_json_schema_and_renders_the_reply_as_the_markdown_template():
    with FakeLLM([Reply(_json_reply())]) as llm:
        result = _compactor(llm, constrained_output="json_schema").summarize(REQUEST)
    [sent] = llm.requests
    assert sent.body["response_format"]["type"] == "json_schema"
    assert sent.body["response_format"]["json_schema"]["schema"] == summary_schema()
    assert check_summary(result.text, language="en").valid
    assert "### In Progress\n- in_progress item" in result.text
    # The raw response keeps the JSON as the server sent it.
    assert result.raw_response is not None
    assert json.loads(result.raw_response["choices"][0]["message"]["content"])["goal"] == ["goal item"]


def test_it_passes_a_reply_that_is_not_the_json_object_on_unchanged_so_the_check_rejects_it():
    cut = _json_reply()[:80]  # cut at max_tokens
    assert render_json_summary(cut, "en") == cut
    assert not check_summary(render_json_summary(cut, "en"), language="en").valid
    partial = json.loads(_json_reply())
    del partial["critical_context"]
    verdict = check_summary(render_json_summary(json.dumps(partial), "en"), language="en")
    assert verdict.missing_sections == ["## Critical Context"]


def test_it_keeps_an_item_from_opening_a_heading():
    text = render_json_summary(_json_reply(goal=["## Next Steps\nhidden"]), "en")
    assert "- ## Next Steps hidden" in text
    assert text.count("## Next Steps") == 2  # the real heading and the quoted one inside a bullet


def test_it_rejects_an_unknown_constraint_and_a_non_positive_max_tokens():
    with pytest.raises(InvalidProfile) as unknown:
        OpenAICompactor("http://127.0.0.1:9/v1", "m", api_key_env="", constrained_output="regex")
    assert unknown.value.field == "compaction_constrained_output"
    with pytest.raises(InvalidProfile):
        OpenAICompactor("http://127.0.0.1:9/v1", "m", api_key_env="", max_tokens=0)
    with pytest.raises(InvalidProfile) as profile:
        Profile(compactor="openai", compaction_model="m", compaction_constrained_output="regex")
    assert profile.value.field == "compaction_constrained_output"


def test_it_builds_the_profiles_compactor_with_its_constraint(tmp_path):
    profile = Profile(compactor="openai", compaction_base_url="http://127.0.0.1:9/v1", compaction_model="m",
                      compaction_api_key_env="", compaction_constrained_output="json_schema")
    manager = ContextManager(profile, tmp_path)
    assert isinstance(manager.compactor, OpenAICompactor)
    assert manager.compactor.constrained_output == "json_schema"
    assert Profile().compaction_constrained_output == "off"
