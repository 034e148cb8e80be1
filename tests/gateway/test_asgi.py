"""Under Daphne (ASGI), as deployed: streaming is incremental, sessions are managed the same way."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator

import httpx2
import pytest
from openai import OpenAI

from tests.gateway.provider import Answer, Provider, scripted
from tests.gateway.servers import RunningGateway, embedded_only, gateway_under_daphne

pytestmark = embedded_only

SYSTEM = {"role": "system", "content": "You are a build agent."}


@pytest.fixture
def provider() -> Iterator[Provider]:
    with Provider() as stub:
        yield stub


@pytest.fixture(params=["daphne", "uvicorn"])
def daphne_gateway(request, tmp_path, provider) -> Iterator[RunningGateway]:
    # Daphne (Channels' own server, and the e2e tests') and uvicorn (what scripts/start.sh serves with).
    with gateway_under_daphne(tmp_path / "asgi", provider.base_url, knobs={"max_input_length": 4_000},
                              server=request.param) as gateway:
        yield gateway


def test_it_streams_each_event_as_it_comes_under_daphne(daphne_gateway, provider):
    # Events 0.3 s apart over about 1.5 s. Relayed as they come, the client sees
    # them spread the same way; buffered (a plain generator under ASGI), they
    # would all arrive together at the end.
    provider.responder = lambda body: Answer("one two three four", chunk_delay=0.3)
    client = OpenAI(base_url=daphne_gateway.url, api_key=daphne_gateway.token, max_retries=0, timeout=30)
    start = time.perf_counter()
    arrivals = []
    text = []
    for chunk in client.chat.completions.create(model="gpt-4o", stream=True, messages=[
            SYSTEM, {"role": "user", "content": "Count."}]):
        arrivals.append(time.perf_counter() - start)
        text.extend(c.delta.content or "" for c in chunk.choices)
    assert "".join(text) == "one two three four"
    assert arrivals[-1] - arrivals[0] > 1.0
    assert provider.chat_requests[-1].body["stream_options"] == {"include_usage": True}


def test_it_manages_and_records_sessions_under_daphne(daphne_gateway, provider):
    provider.responder = lambda body: Answer("fine")
    client = OpenAI(base_url=daphne_gateway.url, api_key=daphne_gateway.token, max_retries=0, timeout=30)
    messages: list = [SYSTEM, {"role": "user", "content": "Status?"}]
    for n in range(3):
        raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=messages)
        assert raw.headers["X-ContextLab-Managed"] == "true"
        messages += [raw.parse().choices[0].message, {"role": "user", "content": f"and {n}?"}]
    session_id = raw.headers["X-ContextLab-Session"]
    auth = {"Authorization": f"Bearer {daphne_gateway.token}"}
    base = daphne_gateway.url.removesuffix("/v1")
    detail = httpx2.get(f"{base}/api/v1/sessions/{session_id}", headers=auth, timeout=30).json()
    assert detail["turns"] == 3 and detail["messages"] == 6
    turn = httpx2.get(f"{base}/api/v1/sessions/{session_id}/turns/3", headers=auth, timeout=30).json()
    assert turn["usage"]["prompt_tokens"] == 321 and turn["trace"]["steps"]


def test_overlapping_attempts_of_one_call_keep_the_reply_the_client_took(daphne_gateway, provider):
    client = OpenAI(base_url=daphne_gateway.url, api_key=daphne_gateway.token, max_retries=0, timeout=30)
    asked = [SYSTEM, {"role": "user", "content": "Status?"}]
    raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=asked)
    session_id = raw.headers["X-ContextLab-Session"]
    follow_up = [*asked, {"role": "assistant", "content": raw.parse().choices[0].message.content},
                 {"role": "user", "content": "Details?"}]
    provider.responder = scripted(Answer("too late", delay=2.5), Answer("in time"))
    # The SDK gives up on the first attempt after 1 s and retries while the first is still running.
    impatient = OpenAI(base_url=daphne_gateway.url, api_key=daphne_gateway.token, max_retries=1, timeout=1.0)
    assert impatient.chat.completions.create(model="gpt-4o", messages=follow_up).choices[0].message.content == (
        "in time")
    time.sleep(3.0)  # let the abandoned first attempt get its answer and try to record it
    auth = {"Authorization": f"Bearer {daphne_gateway.token}"}
    base = daphne_gateway.url.removesuffix("/v1")
    listed = httpx2.get(f"{base}/api/v1/sessions", headers=auth, timeout=30).json()
    assert [s["id"] for s in listed["sessions"]] == [session_id]
    detail = httpx2.get(f"{base}/api/v1/sessions/{session_id}", headers=auth, timeout=30).json()
    assert (detail["turns"], detail["messages"]) == (2, 4)
    with sqlite3.connect(daphne_gateway.database) as db:
        stored = [json.loads(row[0]) for row in db.execute(
            "SELECT content FROM contextlab_sessions_sessionmessage ORDER BY seq")]
    assert [block["text"] for content in stored for block in content][-2:] == ["Details?", "in time"]
