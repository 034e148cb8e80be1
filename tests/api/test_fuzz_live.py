"""Schemathesis against the running server: the document and the server agree, both ways.

The project runs under daphne (its real ASGI application, in a subprocess with
a database of its own) seeded with an account holding every kind of session
(``tests.api.fuzz_world``). Schemathesis loads ``/api/v1/openapi.json`` from the
live URL and runs its examples, coverage, fuzzing and stateful phases on every
operation with every check: no 5xx, only declared status codes, content types, headers
and shapes, and the strictness checks (a request the document forbids is
refused, one it allows is accepted, a missing token or an undeclared method is
refused). Any failure fails the test with schemathesis' report and a curl
command to replay it.

Seeded and bounded: the same requests every run, two to three minutes on CI. A deeper
or different run, locally:
``CONTEXTLAB_FUZZ_EXAMPLES=300 CONTEXTLAB_FUZZ_SEED=7 pytest tests/api/test_fuzz_live.py``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.gateway.servers import REPO, _environment, _wait_until_serving, embedded_only

SEED = int(os.environ.get("CONTEXTLAB_FUZZ_SEED") or 20_261_203)
MAX_EXAMPLES = int(os.environ.get("CONTEXTLAB_FUZZ_EXAMPLES") or 40)
PHASES = os.environ.get("CONTEXTLAB_FUZZ_PHASES") or "examples,coverage,fuzzing,stateful"
CONFIG = Path(__file__).with_name("schemathesis.toml")
SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")

pytestmark = embedded_only


@dataclass
class LiveServer:
    url: str
    world: dict[str, Any]
    env: dict[str, str]
    log: Path


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    folder = tmp_path_factory.mktemp("live-fuzz")
    env = _environment(folder)
    # The fuzzer sends thousands of requests a minute with one token.
    env["CONTEXTLAB_RATE_LIMIT_API"] = "off"
    seeded = subprocess.run([sys.executable, "-m", "tests.api.fuzz_world"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=300, check=False)
    assert seeded.returncode == 0, seeded.stderr
    world = json.loads(seeded.stdout.strip().splitlines()[-1])

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    log_path = folder / "daphne.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "daphne", "--fd", str(listener.fileno()), "contextlab.asgi:application"],
            cwd=REPO, env=env, pass_fds=(listener.fileno(),), stdout=log, stderr=subprocess.STDOUT)
        listener.close()
        try:
            _wait_until_serving(url, process, folder, 60)
            yield LiveServer(url=url, world=world, env=env, log=log_path)
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


def test_it_serves_every_policy_to_the_fuzzer(live: LiveServer) -> None:
    # The fuzz is only as good as its data: every policy, evicted turns, a
    # compaction run, a summary and an import are there to be read.
    headers = {"Authorization": f"Bearer {live.world['token']}"}
    listed = httpx2.get(f"{live.url}/api/v1/sessions", headers=headers, timeout=30).json()["sessions"]
    assert {s["policy"] for s in listed} == {"contextlab", "copaw", "eviction"}
    assert any(s["source"] for s in listed)
    assert live.world["evicted_turns"] >= 1 and live.world["summary_version"] >= 1
    run = httpx2.get(f"{live.url}/api/v1/sessions/{live.world['session_id']}/runs/{live.world['run_id']}",
                     headers=headers, timeout=30).json()
    assert run["status"] == "done"


def test_it_agrees_with_its_document_under_schemathesis(live: LiveServer, tmp_path: Path) -> None:
    auth = tmp_path / "auth.json"
    auth.write_text(json.dumps({"auth": [
        {"name": name, "fixedHeaders": [{"name": "Authorization", "value": f"Bearer {live.world[key]}"}]}
        for name, key in (("fuzzer", "token"), ("bob", "peer_token"))]}))
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.api.fuzz_hooks", "CONTEXTLAB_FUZZ_AUTH": str(auth),
           "CONTEXTLAB_FUZZ_WORLD": json.dumps(live.world),
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    command = [
        str(SCHEMATHESIS), "--config-file", str(CONFIG), "run", f"{live.url}/api/v1/openapi.json",
        "--checks", "all", "--phases", PHASES,
        "--seed", str(SEED), "--max-examples", str(MAX_EXAMPLES),
        "--no-color",
    ]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False)
    report = result.stdout + result.stderr
    server_log = live.log.read_text(errors="replace")
    assert result.returncode == 0, f"{report}\n--- server log (tail)\n{server_log[-4000:]}"
    print(report[report.rfind("SUMMARY"):])  # shown with pytest -rP: operations, phases, cases generated
    assert "Traceback" not in server_log, server_log[-4000:]


@pytest.mark.parametrize("body", [b"--b0undary--\r\n", b"not a multipart body at all"])
def test_it_explains_a_malformed_multipart_body_in_json(live: LiveServer, body: bytes) -> None:
    # Twisted, under daphne, answered these with a bare 400 before Django ran.
    response = httpx2.post(f"{live.url}/api/v1/imports", content=body, timeout=30, headers={
        "Authorization": f"Bearer {live.world['token']}", "Content-Type": "multipart/form-data; boundary=b0undary"})
    assert response.status_code == 400
    assert response.headers["content-type"] == "application/json"
    assert response.json()["field"] in ("file", "body")
