"""Observe mode end to end: the 75 requests of a real CoPaw run, replayed through the gateway.

The fake upstream answers each request with what the recording says CoPaw got;
the gateway must pass every request and every answer byte for byte and build,
from the requests alone, the session the workspace import also finds.
"""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest

from contextlab.engine.importers.copaw_workspace import import_copaw_workspace
from contextlab.gateway import observe as observe_gateway
from contextlab.gateway.models import ObservedCall, UpstreamProvider
from contextlab.sessions.models import AgentProfile, AgentSession, SessionMessage, SummaryVersion, Turn
from contextlab.sessions.services.observed import observed_session_write
from tests.gateway.provider import Answer, Provider, stream_chunks
from tests.observed.copaw import REQUESTS, WORKSPACE, analysis, recorded_requests


def _answer_for(recordings: list[dict[str, Any]]) -> Any:
    def respond(body: dict[str, Any]) -> Answer:
        record = next(r for r in recordings if r["body"] == body)
        calls = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                 for c in record.get("response_tool_calls") or []]
        return Answer(content=record["response_text"] or None, tool_calls=calls)
    return respond


def _expected_stream(step: Answer, number: int) -> bytes:
    return b"".join(b"data: " + (c if isinstance(c, bytes) else json.dumps(c).encode()) + b"\n\n"
                    for c in stream_chunks(step, number, include_usage=True))


@pytest.fixture
def replayed(gateway_url: str, alice, alice_token: str) -> dict[str, Any]:
    recordings = recorded_requests()
    respond = _answer_for(recordings)
    profile = AgentProfile.objects.create(owner=alice, name="copaw", policy="copaw", max_input_length=12000,
                                          compact_ratio=0.75, reserve_ratio=0.15, recent_n=2, old_max_bytes=1000,
                                          recent_max_bytes=5000)
    sent: list[bytes] = []
    received: list[bytes] = []
    with Provider(respond) as provider:
        UpstreamProvider.objects.create(profile=profile, base_url=provider.base_url, api_key="sk-upstream",
                                        mode=UpstreamProvider.Mode.OBSERVE, timeout=30)
        with httpx2.Client(timeout=60) as http:
            for index, record in enumerate(recordings):
                # Odd spacing on purpose: only a byte-for-byte relay keeps it.
                data = json.dumps(record["body"], ensure_ascii=index % 2 == 0, indent=index % 3 or None).encode()
                sent.append(data)
                answer = http.post(f"{gateway_url}/chat/completions", content=data,
                                   headers={"Authorization": f"Bearer {alice_token}",
                                            "Content-Type": "application/json"})
                assert answer.status_code == 200, answer.text
                assert answer.headers["X-ContextLab-Managed"] == "false"
                received.append(answer.content)
        upstream = [r.raw for r in provider.chat_requests]
    return {"recordings": recordings, "sent": sent, "received": received, "upstream": upstream,
            "respond": respond, "profile": profile}


def test_it_replays_copaw_in_observe_mode_and_finds_what_happened(replayed: dict[str, Any]) -> None:
    expected = analysis()
    recordings = replayed["recordings"]
    # Byte for byte, both ways.
    assert replayed["upstream"] == replayed["sent"]
    for number, (record, content) in enumerate(zip(recordings, replayed["received"], strict=True), start=1):
        assert content == _expected_stream(replayed["respond"](record["body"]), number)

    [session] = AgentSession.objects.filter(source__format="observed")
    calls = ObservedCall.objects.filter(profile=replayed["profile"])
    assert calls.count() == 75 and set(calls.values_list("conversation", flat=True)) == {"c1"}
    assert calls.filter(side_call=True).count() == 16
    assert set(calls.values_list("session", flat=True)) == {session.pk}

    turns = Turn.objects.filter(session=session).order_by("number")
    assert turns.count() == expected["requests_by_kind"]["agent"]
    # The chart draws each turn's threshold: the profile's, as the gauge shows it, never 0.
    assert set(turns.values_list("threshold", "window")) == {(session.tokens_threshold, session.tokens_window)}
    assert session.tokens_threshold == replayed["profile"].threshold > 0
    compacted = list(turns.filter(outcome="compacted"))
    assert [t.trace["observed"]["request"] for t in compacted] == [
        w["from_seq"] for w in expected["summary_wrapper_changes"]]
    assert [t.trigger for t in compacted] == ["auto", "auto", "manual", "auto"]
    assert [t.compacted_count for t in compacted] == [27, 33, 25, 16]
    assert session.compactions_count == 4

    versions = list(SummaryVersion.objects.filter(session=session).order_by("version"))
    assert [v.version for v in versions] == [1, 2, 3, 4]
    assert [v.compactor for v in versions] == [f"agent (request {c['seq']})" for c in expected["compactor_calls"]]
    summary_steps = [t.trace["steps"] for t in compacted]
    assert all(any(s["step"] == "summary" for s in steps) for steps in summary_steps)
    assert all(e.get("diff") for t in compacted[1:] for e in t.trace["observed"]["events"]
               if e["kind"] == "summary_replaced")

    # Every shortened tool result, with the sizes the recording shows.
    for row in expected["tool_rows"]:
        message = SessionMessage.objects.get(session=session, message_id=f"tool:{row['id']}")
        sizes = [int(step.split(":")[1].split("B")[0]) for step in row["trajectory"]]
        cuts = [e for e in message.fate if e["event"] == "truncated"]
        if row["shrank"]:
            assert message.truncated_stage is not None, row["id"]
            assert [e["bytes_after"] for e in cuts if e["bytes_before"] is not None] == sizes[1:], row["id"]
        else:
            assert cuts == [] and message.truncated_stage is None, row["id"]

    # The same story as the workspace import of the same run.
    _, report = import_copaw_workspace(WORKSPACE, REQUESTS)
    assert [(c["seq"], c["trigger"], c["dropped"]) for c in report["compaction_detail"]] == [
        (t.trace["observed"]["request"], t.trigger, t.compacted_count) for t in compacted]
    compacted_rows = SessionMessage.objects.filter(session=session, compacted_turn__isnull=False)
    assert compacted_rows.count() == report["archived_messages"]
    assert session.summary == report["summary"]
    assert session.live_count == len(recordings[-1]["body"]["messages"])


def _rows(session: AgentSession) -> dict[str, Any]:
    """Everything a rewrite of an observed session sets, in a comparable form."""
    return {
        "messages": list(SessionMessage.objects.filter(session=session).order_by("seq").values_list(
            "message_id", "seq", "role", "content", "current_content", "status", "truncated_stage",
            "truncated_turn", "compacted_turn", "summary_version", "fate")),
        "versions": list(SummaryVersion.objects.filter(session=session).order_by("version").values_list(
            "version", "text", "turn", "trigger", "compactor", "compacted_ids")),
        "files": sorted(session.offloaded_files.values_list("path", "message_id", "stage", "bytes", "kept_bytes")),
        "turns": list(Turn.objects.filter(session=session).order_by("number").values_list(
            "number", "trigger", "outcome", "trace", "payload_tokens", "compacted_count", "summary_version")),
        "session": AgentSession.objects.filter(pk=session.pk).values(
            "summary", "summary_version", "turns_count", "compactions_count", "failures_count", "messages_count",
            "live_count", "tokens_used").get(),
    }


def test_it_writes_call_by_call_the_same_rows_a_rewrite_from_scratch_writes(replayed: dict[str, Any]) -> None:
    # The gateway fed the kept inference one call at a time and wrote only the rows that
    # changed; reading every recorded call again and writing every row must find the same.
    [session] = AgentSession.objects.filter(source__format="observed")
    incremental = _rows(session)
    calls = ObservedCall.objects.filter(profile=replayed["profile"], status_code=200, error="").order_by("pk")
    requests = [observe_gateway._recorded_request(seq, call) for seq, call in enumerate(calls, start=1)]
    observed_session_write(session, requests, "c1")
    assert _rows(session) == incremental
    assert len(incremental["messages"]) > 100 and len(incremental["versions"]) == 4
