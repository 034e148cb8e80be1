"""A turn answered is a turn recorded, through kill -9 right after the answer.

The project is served as scripts/start.sh serves it (uvicorn, the real ASGI
application, an SQLite file), armed (``tests.gateway.killed_after_answer``) to
SIGKILL itself at the first moment after the agent has its answer: in observe
mode when the session is about to be rebuilt (the answer went out with the call
only committed as pending), in manage mode when Django closes the answered
response of the call. The server
is then started again on the same database, and the turn must be in its
session: observe mode settles its pending calls when the application loads;
manage mode writes the turn before it answers.
"""

from __future__ import annotations

import json
import signal
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx2
import pytest

from tests.gateway.provider import Answer, Provider, scripted
from tests.gateway.servers import REPO, SEED, _environment, _wait_until_serving, embedded_only

# tests/scaled/test_kill_after_answer.py is the same proof on PostgreSQL and Redis.
pytestmark = embedded_only


@contextmanager
def _served(folder: Path, env: dict[str, str], *,
            killed_after_answer: bool = False) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """uvicorn as scripts/start.sh runs it, serving the application or the one armed to be killed."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    port = listener.getsockname()[1]
    log = (folder / "daphne.log").open("ab")
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--fd", str(listener.fileno()), "--loop", "uvloop", "--http",
         "contextlab.core.uvicorn_http:HeaderTimeoutHttpTools", "--ws", "websockets", "--lifespan", "off",
         "--no-access-log",
         "tests.gateway.killed_after_answer:application" if killed_after_answer else "contextlab.asgi:application"],
        cwd=REPO, env=env, pass_fds=(listener.fileno(),), stdout=log, stderr=subprocess.STDOUT)
    listener.close()
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_serving(url, process, folder, 60)
        yield url, process
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait(timeout=10)
        log.close()


def _seeded(folder: Path, base_url: str, mode: str) -> tuple[dict[str, str], str]:
    env = _environment(folder)
    # Off by default under pytest (importing the application must not touch a test's database): on, as in production.
    env["CONTEXTLAB_SETTLE_AT_START"] = "true"
    config = json.dumps({"base_url": base_url, "knobs": {}, "provider": {"mode": mode}})
    seeded = subprocess.run([sys.executable, "-c", SEED, config], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=120, check=False)
    assert seeded.returncode == 0, seeded.stderr
    return env, seeded.stdout.strip().splitlines()[-1]


def _call(url: str, token: str, messages: list[dict[str, str]], *, stream: bool) -> bytes:
    with httpx2.Client(timeout=30) as http:
        answer = http.post(f"{url}/v1/chat/completions", json={"model": "gpt-4o", "messages": messages,
                                                               "stream": stream},
                           headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 200, answer.text
    return answer.content


def _recorded_turns(database: Path) -> list[tuple[int, str]]:
    """(turn number, its payload) of every turn of every session, in order."""
    with sqlite3.connect(database) as db:
        return [(number, payload) for number, payload in db.execute(
            "SELECT number, payload FROM contextlab_sessions_turn ORDER BY session_id, number")]


def _killed(process: subprocess.Popen[bytes]) -> None:
    assert process.wait(timeout=30) == -signal.SIGKILL


@pytest.mark.parametrize("stream", [False, True], ids=["completion", "stream"])
def test_an_observed_turn_answered_before_a_kill_is_in_its_session_after_the_restart(tmp_path: Path,
                                                                                     stream: bool) -> None:
    messages = [{"role": "system", "content": "You are a build engineer."},
                {"role": "user", "content": "Build the shop target and report the warnings."}]
    with Provider(scripted(Answer("Built; two warnings in build.log."), Answer("Both warnings fixed."))) as provider:
        env, token = _seeded(tmp_path, provider.base_url, "observe")
        with _served(tmp_path, env) as (url, _):
            _call(url, token, messages, stream=stream)
        messages += [{"role": "assistant", "content": "Built; two warnings in build.log."},
                     {"role": "user", "content": "Fix both warnings, then build again."}]
        with _served(tmp_path, env, killed_after_answer=True) as (url, process):
            answer = _call(url, token, messages, stream=stream)
            assert b"Both" in answer and (b"[DONE]" in answer if stream else b"Both warnings fixed." in answer)
            _killed(process)
        database = tmp_path / "gateway.sqlite3"
        with sqlite3.connect(database) as db:
            # What the kill left: the call committed, not yet taken into a session.
            assert db.execute("SELECT count(*) FROM gateway_observedcall WHERE conversation = ''").fetchone() == (1,)
        assert len(_recorded_turns(database)) == 1
        with _served(tmp_path, env):
            pass  # the application settled the pending call as it loaded, before it served
    with sqlite3.connect(database) as db:
        assert db.execute("SELECT count(*) FROM gateway_observedcall WHERE conversation = ''").fetchone() == (0,)
        assert db.execute("SELECT count(DISTINCT session_id) FROM gateway_observedcall").fetchone() == (1,)
    turns = _recorded_turns(database)
    assert [number for number, _ in turns] == [1, 2]
    assert "Fix both warnings, then build again." in turns[1][1]


def test_a_managed_turn_answered_before_a_kill_is_in_its_session_after_the_restart(tmp_path: Path) -> None:
    # Manage mode writes the turn, with the provider's reply, before it answers: nothing waits for after.
    messages = [{"role": "system", "content": "You are a build engineer."},
                {"role": "user", "content": "Build the shop target and report the warnings."}]
    with Provider(scripted(Answer("Built; two warnings in build.log."))) as provider:
        env, token = _seeded(tmp_path, provider.base_url, "manage")
        with _served(tmp_path, env, killed_after_answer=True) as (url, process):
            assert b"two warnings" in _call(url, token, messages, stream=False)
            _killed(process)
    database = tmp_path / "gateway.sqlite3"
    turns = _recorded_turns(database)
    assert [number for number, _ in turns] == [1]
    assert "Build the shop target" in turns[0][1]
    with sqlite3.connect(database) as db:
        replies = [content for (content,) in db.execute(
            "SELECT content FROM contextlab_sessions_sessionmessage WHERE role = 'assistant'")]
    assert len(replies) == 1 and "Built; two warnings in build.log." in replies[0]
