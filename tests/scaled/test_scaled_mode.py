"""Scaled mode end to end: web processes, a celery worker, PostgreSQL and Redis, for real.

A compaction posted to web process 1 runs on the worker, and its progress
reaches a websocket connected to web process 2. Killing the worker in the
middle of a run loses nothing: the run is failed (or retried) and the session
is exactly as it was, or exactly compacted once.
"""

from __future__ import annotations

import subprocess
import time
from typing import Any

import pytest

from tests.conversations import answer, tool_turn
from tests.fakellm import FakeLLM, Reply, Sleep
from tests.scaled.conftest import skip_unless_scaled
from tests.scaled.deployment import Api, Deployment, Viewer, ws_url

pytestmark = skip_unless_scaled

SUMMARY = ("## Goal\n- build every target\n## Constraints & Preferences\n- none\n## Progress\n### Done\n- t1\n"
           "### In Progress\n- t2\n### Blocked\n- none\n## Key Decisions\n- use make\n## Next Steps\n- t3\n"
           "## Critical Context\n- /srv/app/t1.log\n")

STATE = """
import json
from contextlab.sessions.models import AgentSession, SessionMessage
from tests.invariants import assert_nothing_lost
session = AgentSession.objects.get(pk={session_id!r})
assert_nothing_lost(session)
archived = []
for path in sorted((session.workspace / "dialog").glob("*.jsonl")):
    archived += [json.loads(line)["id"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
print(json.dumps({{
    "messages": session.messages_count, "live": session.live_count, "turns": session.turns_count,
    "summary_version": session.summary_version, "compactions": session.compactions_count,
    "archived_lines": archived,
    "archived_rows": SessionMessage.objects.filter(session=session, status="archived").count(),
}}))
"""


def _session(api: Api, llm: FakeLLM, *, timeout: float) -> str:
    profile = api.post("/profiles", {
        "name": f"scaled-{time.monotonic_ns()}", "max_input_length": 4_000, "recent_n": 2,
        "recent_max_bytes": 1_500, "old_max_bytes": 400, "compactor": "openai", "compaction_provider": "fake",
        "compaction_model": "fake-model", "compaction_timeout": timeout,
        "compaction_retries": 0,
    })
    session = api.post("/sessions", {"system_prompt": "You are a careful coding agent.", "profile": profile["id"]})
    for i in range(1, 4):
        api.post(f"/sessions/{session['id']}/messages",
                 {"messages": [*([answer(i - 1)] if i > 1 else []), *tool_turn(i)]})
    return str(session["id"])


def _state(deployment: Deployment, session_id: str) -> dict[str, Any]:
    state: dict[str, Any] = deployment.python(STATE.format(session_id=session_id))
    lines = state["archived_lines"]
    assert isinstance(lines, list)
    assert len(lines) == len(set(lines)), "a message was archived twice"
    assert len(lines) == state["archived_rows"]
    return state


def _wait_for_run(api: Api, session_id: str, run_id: int, statuses: tuple[str, ...],
                  timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        run: dict[str, Any] = api.get(f"/sessions/{session_id}/runs/{run_id}")
        if run["status"] in statuses:
            return run
        assert time.monotonic() < deadline, f"run {run_id} still {run['status']} after {timeout} s"
        time.sleep(0.2)


@pytest.fixture
def worker(deployment: Deployment):
    deployment.start_worker("worker")
    yield deployment
    deployment.stop("worker")
    deployment.stop("worker2")
    deployment.stop("beat")


def test_it_delivers_a_run_on_the_worker_to_a_viewer_of_the_other_web_process(deployment, worker, web1, web2):
    with FakeLLM([Sleep(0.5, Reply(SUMMARY))], port=deployment.llm_port) as llm:
        session_id = _session(web1, llm, timeout=30)
        viewer = Viewer(ws_url(deployment.processes["web2"], session_id))
        try:
            run = web1.post(f"/sessions/{session_id}/compact", {"background": True}, expect=202)["run"]
            assert run["status"] == "queued"
            done = viewer.wait_for(lambda e: e.get("type") == "run.update" and e["run_id"] == run["id"]
                                   and e["run"]["status"] in ("done", "failed"), timeout=60)
            statuses = viewer.run_statuses(run["id"])
            gauge = viewer.wait_for(lambda e: e.get("type") == "gauge.update"
                                    and e["state"]["summary_version"] == 1, timeout=10)
        finally:
            viewer.close()
    assert done["run"]["status"] == "done", deployment.logs()
    assert done["run"]["outcome"] == "compacted"
    # queued (from web 1), then running and done (from the worker), in that order.
    assert statuses[0] == "queued" and "running" in statuses and statuses[-1] == "done"
    assert statuses.index("running") < len(statuses) - 1
    assert gauge["state"]["compactions"] == 1
    assert len(llm.requests) == 1
    # The worker ran it; neither web process did.
    assert "compact_session" in deployment.processes["worker"].log_text()
    assert "compact_session" not in deployment.processes["web1"].log_text()
    # Web process 2 reads the same row.
    assert web2.get(f"/sessions/{session_id}/runs/{run['id']}")["status"] == "done"
    state = _state(deployment, session_id)
    assert state["summary_version"] == 1 and state["archived_rows"] > 0


def test_it_loses_nothing_when_the_worker_is_killed_during_a_compaction(deployment, worker, web1, web2):
    # The first summary call hangs until the worker is killed; the later ones answer.
    with FakeLLM([Sleep(300, Reply(SUMMARY)), Reply(SUMMARY)], port=deployment.llm_port) as llm:
        session_id = _session(web1, llm, timeout=600)
        before = _state(deployment, session_id)
        viewer = Viewer(ws_url(deployment.processes["web2"], session_id))
        try:
            run = web1.post(f"/sessions/{session_id}/compact", {"background": True}, expect=202)["run"]
            viewer.wait_for(lambda e: e.get("type") == "run.update" and e["run"]["status"] == "running")
            deadline = time.monotonic() + 30
            while not llm.requests:
                assert time.monotonic() < deadline, deployment.logs()
                time.sleep(0.05)
            # Mid-run: the worker holds the session's row lock, waiting for the model.
            deployment.kill("worker")
            assert web2.get(f"/sessions/{session_id}/runs/{run['id']}")["status"] == "running"
            assert _state(deployment, session_id) == before

            # A new worker takes over: the dead one's run is failed (or, if Redis
            # hands the job back first, run again to the end), never half done.
            deployment.start_worker("worker2")
            settled = _wait_for_run(web2, session_id, run["id"], ("done", "failed"))
            viewer.wait_for(lambda e: e.get("type") == "run.update" and e["run_id"] == run["id"]
                            and e["run"]["status"] == settled["status"])
        finally:
            viewer.close()
        after = _state(deployment, session_id)
        if settled["status"] == "failed":
            assert "stopped before it finished" in settled["error"]
            assert after == before  # no half compaction: not a message moved
            # And the session still works: the next run compacts it, once.
            again = web1.post(f"/sessions/{session_id}/compact", {"background": True}, expect=202)["run"]
            assert _wait_for_run(web2, session_id, again["id"], ("done", "failed"))["status"] == "done"
            after = _state(deployment, session_id)
        assert after["summary_version"] == 1 and after["compactions"] == 1
        assert after["messages"] == before["messages"]  # nothing lost, nothing added twice
        assert after["archived_rows"] > 0


def test_it_runs_the_job_again_when_only_the_process_running_it_dies(deployment, worker, web1, web2):
    with FakeLLM([Sleep(300, Reply(SUMMARY)), Reply(SUMMARY)], port=deployment.llm_port) as llm:
        session_id = _session(web1, llm, timeout=600)
        before = _state(deployment, session_id)
        run = web1.post(f"/sessions/{session_id}/compact", {"background": True}, expect=202)["run"]
        deadline = time.monotonic() + 30
        while not llm.requests:
            assert time.monotonic() < deadline, deployment.logs()
            time.sleep(0.05)
        # The pool process running the task dies (an OOM kill); the worker itself lives,
        # sees the job lost and, with acks_late + reject_on_worker_lost, runs it again.
        parent = deployment.processes["worker"].popen.pid
        children = subprocess.run(["pgrep", "-P", str(parent)], capture_output=True, text=True).stdout.split()
        assert children, deployment.logs()
        for pid in children:
            subprocess.run(["kill", "-9", pid], check=False)
        settled = _wait_for_run(web2, session_id, run["id"], ("done", "failed"), timeout=90)
    assert settled["status"] == "done", deployment.logs()
    assert len(llm.requests) == 2  # the lost attempt and the retry
    after = _state(deployment, session_id)
    assert after["summary_version"] == 1 and after["compactions"] == 1
    assert after["messages"] == before["messages"]


def test_the_beat_process_sweeps_runs_left_by_a_dead_worker(deployment, worker, web1, web2):
    with FakeLLM([Reply(SUMMARY)], port=deployment.llm_port) as llm:
        session_id = _session(web1, llm, timeout=30)
    # A run a worker had started when it vanished (nobody holds it).
    run_id = deployment.python(
        "import json\nfrom django.utils import timezone\nfrom contextlab.sessions.models import CompactionRun\n"
        f"run = CompactionRun.objects.create(session_id={session_id!r}, status='running', started=timezone.now())\n"
        "print(json.dumps(run.pk))")
    deployment.start_beat()  # sweeps every second in these tests
    run = _wait_for_run(web2, session_id, run_id, ("failed",), timeout=60)
    assert "stopped before it finished" in run["error"]
    assert "Sending due task reap-stale-runs" in deployment.processes["beat"].log_text()

