"""Claude Code and the anthropic SDK against ContextLab under Daphne (ASGI), as deployed."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from tests.gateway.agents.claude_code import run_claude
from tests.gateway.agents.test_claude_code import SECRET, brain
from tests.gateway.anthropic_provider import Answer, AnthropicProvider
from tests.gateway.servers import RunningGateway, embedded_only, gateway_under_daphne

pytestmark = embedded_only


@pytest.fixture
def anthropic_upstream() -> Iterator[AnthropicProvider]:
    with AnthropicProvider() as provider:
        yield provider


@pytest.fixture
def daphne_observing(tmp_path, anthropic_upstream) -> Iterator[RunningGateway]:
    with gateway_under_daphne(tmp_path / "asgi", anthropic_upstream.base_url,
                              knobs={"max_input_length": 200_000},
                              provider={"kind": "anthropic", "mode": "observe"}) as gateway:
        yield gateway


def _rows(gateway: RunningGateway, query: str) -> list[Any]:
    with sqlite3.connect(gateway.database) as db:
        return list(db.execute(query))


def test_it_relays_each_event_as_it_comes_under_daphne(daphne_observing, anthropic_upstream):
    # Nine events 0.25 s apart. Relayed as they come, the SDK sees them spread the same
    # way; buffered, they would all arrive together at the end.
    anthropic_upstream.brain = lambda body: Answer([{"type": "text", "text": "one two three four"}],
                                                   event_delay=0.25)
    client = anthropic.Anthropic(base_url=daphne_observing.url.removesuffix("/v1"), api_key=daphne_observing.token,
                                 max_retries=0, timeout=30)
    start = time.perf_counter()
    arrivals = []
    with client.messages.stream(model="claude-sonnet-5", max_tokens=10,
                                messages=[{"role": "user", "content": "Count."}]) as stream:
        for _ in stream:
            arrivals.append(time.perf_counter() - start)
        assert stream.get_final_text() == "one two three four"
    assert arrivals[-1] - arrivals[0] > 1.5
    assert _rows(daphne_observing, "select status_code, error, endpoint from gateway_observedcall") == \
        [(200, "", "anthropic.messages")]


def test_claude_code_runs_its_tools_through_contextlab_under_daphne(tmp_path, daphne_observing, anthropic_upstream):
    project = tmp_path / "project"
    project.mkdir()
    (project / "notes.txt").write_text(SECRET + "\n")
    anthropic_upstream.brain = brain(project)
    base_url = daphne_observing.url.removesuffix("/v1")
    env = {"ANTHROPIC_AUTH_TOKEN": daphne_observing.token}
    first = run_claude("list the files", cwd=project, home=tmp_path / "home", base_url=base_url, env=env)
    second = run_claude("read notes.txt", cwd=project, home=tmp_path / "home", base_url=base_url, env=env, cont=True)
    assert (first.returncode, second.returncode) == (0, 0), (first.stderr[-2000:], second.stderr[-2000:])
    assert first.result["result"].startswith("Tool output: notes.txt")
    assert SECRET in second.result["result"]
    assert _rows(daphne_observing, "select count(*), count(distinct session_id) from gateway_observedcall "
                                   "where status_code = 200 and error = ''") == [(4, 1)]
    assert _rows(daphne_observing, "select turns_count from contextlab_sessions_agentsession") == [(4,)]
