"""The gateway under Daphne (ASGI) in a subprocess, for the ASGI test and the latency benchmark.

pytest-django's live server is WSGI; this runs the project's real ASGI
application the way ``manage.py runserver`` and production do. The subprocess
cannot see the test process's in-memory database, so it gets an SQLite file of
its own, migrated and seeded (a user, an API token, a profile routed to the
given provider) by a first short-lived subprocess.

The listening socket is bound here, on 127.0.0.1 and a free port, and handed to
Daphne as a file descriptor: no race for the port, and the caller knows it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest

REPO = Path(__file__).resolve().parents[2]

# A test that serves the project from a process of its own, on an SQLite file of its own, runs the
# same whichever mode the calling suite is in: the scaled run skips it rather than repeat it. (Its
# scaled-mode counterparts, where there are any, live in tests/scaled/.)
embedded_only = pytest.mark.skipif(
    bool(os.environ.get("CONTEXTLAB_SCALED_TESTS")),
    reason="runs the project in a process and on a database of its own, whatever the mode: once per CI run")

SEED = """
import json, sys
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from django.contrib.auth.models import User
from contextlab.api.models import ApiToken
from contextlab.gateway.models import UpstreamProvider
from contextlab.sessions import services
config = json.loads(sys.argv[1])
user = User.objects.create_user("agent", "agent@example.org", "pw")
profile = services.profile_create(owner=user, name="gateway", knobs=config["knobs"])
UpstreamProvider.objects.create(profile=profile, base_url=config["base_url"], api_key="sk-upstream",
                                timeout=60, **config["provider"])
print(ApiToken.issue(user=user, name="gateway")[1])
"""


@dataclass
class RunningGateway:
    url: str  # the OpenAI base URL, ending in /v1
    token: str
    process: subprocess.Popen[bytes]
    database: Path


def _environment(folder: Path) -> dict[str, str]:
    env = dict(os.environ)
    # The vocabularies stay where they are installed, not under the new var/.
    tiktoken_dir = env.get("CONTEXTLAB_TIKTOKEN_DIR") or str(
        Path(env.get("CONTEXTLAB_VAR_DIR") or REPO / "var") / "tiktoken")
    env.update({
        "DJANGO_SETTINGS_MODULE": "contextlab.settings",
        "DATABASE_URL": f"sqlite:///{folder / 'gateway.sqlite3'}",
        "CONTEXTLAB_VAR_DIR": str(folder / "var"),
        "CONTEXTLAB_WORKSPACES_DIR": str(folder / "workspaces"),
        # Embedded mode, whatever the calling environment is set up for.
        "REDIS_URL": "",
        "CONTEXTLAB_EMBEDDED_BEAT": "false",
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p),
    })
    env["CONTEXTLAB_TIKTOKEN_DIR"] = tiktoken_dir
    return env


@contextmanager
def gateway_under_daphne(folder: Path, provider_base_url: str, *, knobs: dict[str, Any] | None = None,
                         startup_timeout: float = 30.0, server: str = "daphne",
                         provider: dict[str, Any] | None = None) -> Iterator[RunningGateway]:
    """Seed a database in ``folder``, serve the project under Daphne (or ``server``: "uvicorn",
    as scripts/start.sh serves it), stop it on exit.

    ``provider``: more fields of the upstream provider row (``kind``, ``mode``, ...)."""
    folder.mkdir(parents=True, exist_ok=True)
    env = _environment(folder)
    config = json.dumps({"base_url": provider_base_url, "knobs": knobs or {}, "provider": provider or {}})
    seeded = subprocess.run([sys.executable, "-c", SEED, config], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=120, check=False)
    if seeded.returncode != 0:
        raise RuntimeError(f"seeding the gateway database failed:\n{seeded.stderr}")
    token = seeded.stdout.strip().splitlines()[-1]

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    port = listener.getsockname()[1]
    log = (folder / "daphne.log").open("wb")
    command = {
        "daphne": ["daphne", "--fd", str(listener.fileno()), "-v", "1"],
        "uvicorn": ["uvicorn", "--fd", str(listener.fileno()), "--loop", "uvloop", "--http", "contextlab.core.uvicorn_http:HeaderTimeoutHttpTools",
                    "--ws", "websockets", "--lifespan", "off", "--no-access-log"],
    }[server]
    process = subprocess.Popen(
        [sys.executable, "-m", *command, "contextlab.asgi:application"],
        cwd=REPO, env=env, pass_fds=(listener.fileno(),), stdout=log, stderr=subprocess.STDOUT)
    listener.close()  # the child holds its own copy
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_serving(url, process, folder, startup_timeout)
        yield RunningGateway(url=f"{url}/v1", token=token, process=process, database=folder / "gateway.sqlite3")
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        log.close()


def _wait_until_serving(url: str, process: subprocess.Popen[bytes], folder: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited:\n{(folder / 'daphne.log').read_text(errors='replace')}")
        try:
            # Any answer (a 401 here) means Django is up behind Daphne.
            httpx2.get(f"{url}/v1/models", timeout=2)
            return
        except httpx2.TransportError:
            time.sleep(0.1)
    raise RuntimeError(f"the server did not answer within {timeout} s")
