"""A scaled-mode deployment on this machine, for the tests and the latency benchmark.

Its own PostgreSQL database (created, migrated, dropped), its own key prefix on
the local Redis, its own workspaces folder, and real processes started and
stopped here: uvicorn web processes, ``celery worker`` and ``celery beat``, each
bound to 127.0.0.1. Nothing is shared with the pytest process but the files.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx2

REPO = Path(__file__).resolve().parents[2]
POSTGRES_URL = os.environ.get("CONTEXTLAB_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres")
TEST_REDIS_URL = os.environ.get("CONTEXTLAB_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


class Unavailable(RuntimeError):
    """PostgreSQL or Redis cannot be reached."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _database_url(name: str) -> str:
    parts = urlsplit(POSTGRES_URL)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


# Databases are created and dropped from the maintenance database, whichever
# database the URL names (scripts/test.sh names the suite's own).
MAINTENANCE_URL = _database_url("postgres")


def drop_database(name: str) -> None:
    import psycopg

    with psycopg.connect(MAINTENANCE_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def delete_redis_keys(prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(TEST_REDIS_URL)
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    if keys:
        client.delete(*keys)


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    url: str = ""

    def log_text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace") if self.log.exists() else ""

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])


@dataclass
class Deployment:
    folder: Path
    env_extra: dict[str, str] = field(default_factory=dict)
    # "embedded" instead: SQLite in the folder, the in-memory layer, jobs in the
    # web process (which must then be the only one).
    mode: str = "scaled"
    name: str = field(default_factory=lambda: f"contextlab_scaled_{secrets.token_hex(4)}")
    processes: dict[str, Process] = field(default_factory=dict)
    created: bool = False
    token: str = ""  # an API token of the user "alice", once api_token() made one
    # The port a test's FakeLLM listens on: the deployment offers it as the provider "fake".
    llm_port: int = field(default_factory=free_port)

    def __post_init__(self) -> None:
        self.prefix = f"{self.name}:"
        self.workspaces = self.folder / "workspaces"
        env = {k: v for k, v in os.environ.items()
               if k not in ("DATABASE_URL", "REDIS_URL", "CONTEXTLAB_REDIS_PREFIX", "PYTEST_VERSION")}
        if self.mode == "scaled":
            env.update({"DATABASE_URL": _database_url(self.name), "REDIS_URL": TEST_REDIS_URL,
                        "CONTEXTLAB_REDIS_PREFIX": self.prefix})
            # Every process of the deployment shares it; scaled mode refuses to start without one.
            env.setdefault("SECRET_KEY", secrets.token_urlsafe(50))
        else:
            env["CONTEXTLAB_EMBEDDED_BEAT"] = "1"
        env.update({
            "DJANGO_SETTINGS_MODULE": "contextlab.settings",
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
            "CONTEXTLAB_WORKSPACES_DIR": str(self.workspaces),
            "CONTEXTLAB_VAR_DIR": str(self.folder / "var"),
            # The vocabularies stay where this checkout installed them.
            "CONTEXTLAB_TIKTOKEN_DIR": os.environ.get("CONTEXTLAB_TIKTOKEN_DIR", str(REPO / "var" / "tiktoken")),
            "PYTHONUNBUFFERED": "1",
            # Served over plain HTTP on 127.0.0.1: no TLS proxy in front.
            "CONTEXTLAB_HTTPS": "0",
            "CONTEXTLAB_PROVIDERS": json.dumps({"fake": {"base_url": f"http://127.0.0.1:{self.llm_port}/v1"}}),
            **self.env_extra,
        })
        self.env = env

    # -- services ------------------------------------------------------------------------

    @staticmethod
    def check_services() -> None:
        import psycopg
        import redis

        try:
            psycopg.connect(MAINTENANCE_URL, connect_timeout=3).close()
        except Exception as exc:
            raise Unavailable(f"PostgreSQL is not reachable at {POSTGRES_URL}: {exc}") from exc
        try:
            redis.Redis.from_url(TEST_REDIS_URL, socket_connect_timeout=3).ping()
        except Exception as exc:
            raise Unavailable(f"Redis is not reachable at {TEST_REDIS_URL}: {exc}") from exc

    def create(self) -> None:
        import psycopg

        (self.folder / "var").mkdir(parents=True, exist_ok=True)
        if self.mode == "scaled":
            self.check_services()
            with psycopg.connect(MAINTENANCE_URL, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{self.name}"')
            self.created = True
        self.manage("migrate", "--noinput")

    def destroy(self) -> None:
        self.stop_all()
        if self.mode != "scaled":
            return
        if self.created:
            drop_database(self.name)
        delete_redis_keys(self.prefix)

    # -- one-off commands ----------------------------------------------------------------

    def manage(self, *args: str) -> str:
        done = subprocess.run([sys.executable, "manage.py", *args], cwd=REPO, env=self.env, capture_output=True,
                              text=True, timeout=180)
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def python(self, code: str) -> Any:
        """Run ``code`` with Django set up against this deployment; it prints one JSON value last."""
        script = "import django; django.setup()\n" + code
        done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=self.env, capture_output=True,
                              text=True, timeout=180)
        if done.returncode != 0:
            raise AssertionError(f"the check failed:\n{done.stdout}\n{done.stderr}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    def api_token(self, username: str = "alice") -> str:
        self.python(f"from django.contrib.auth.models import User; "
                    f"User.objects.get_or_create(username={username!r}); print('null')")
        self.token = self.manage("createapitoken", username).strip().splitlines()[-1]
        return self.token

    # -- processes -----------------------------------------------------------------------

    def _start(self, name: str, argv: list[str], *, env: dict[str, str] | None = None) -> Process:
        # A file per start: a restarted process must not find the old one's lines.
        log = self.folder / f"{name}-{len(list(self.folder.glob(f'{name}-*.log'))) + 1}.log"
        handle = log.open("ab")
        # A session of its own: a kill reaches the process and its children.
        popen = subprocess.Popen(argv, cwd=REPO, env=env or self.env, stdout=handle, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        handle.close()
        process = Process(name, popen, log)
        self.processes[name] = process
        return process

    def start_web(self, name: str, *, app: str = "tests.liveprobe:application", timeout: float = 60) -> Process:
        port = free_port()
        # Served as scripts/start.sh and the Procfile serve it.
        process = self._start(name, [sys.executable, "-m", "uvicorn", "--host", "127.0.0.1", "--port", str(port),
                                     "--loop", "uvloop", "--http", "contextlab.core.uvicorn_http:HeaderTimeoutHttpTools", "--ws", "websockets",
                                     "--lifespan", "off", "--no-access-log", app])
        process.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.popen.poll() is not None:
                raise RuntimeError(f"{name} exited:\n{process.tail()}")
            try:
                if httpx2.get(f"{process.url}/api/v1/openapi.json", timeout=2).status_code == 200:
                    return process
            except httpx2.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{name} did not answer within {timeout} s:\n{process.tail()}")

    def start_worker(self, name: str, *, concurrency: int = 1, timeout: float = 90) -> Process:
        process = self._start(name, [
            sys.executable, "-m", "celery", "-A", "contextlab", "worker", "-l", "info", "-P", "prefork",
            "-c", str(concurrency), "-n", f"{name}-{self.name}@127.0.0.1",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
        ])
        self._wait_for_log(process, " ready.", timeout)
        return process

    def start_beat(self, name: str = "beat", *, timeout: float = 60) -> Process:
        process = self._start(name, [sys.executable, "-m", "celery", "-A", "contextlab", "beat", "-l", "info",
                                     "-s", str(self.folder / "var" / "celerybeat-schedule")])
        self._wait_for_log(process, "beat: Starting", timeout)
        return process

    def _wait_for_log(self, process: Process, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in process.log_text():
                return
            if process.popen.poll() is not None:
                raise RuntimeError(f"{process.name} exited:\n{process.tail()}")
            time.sleep(0.2)
        raise RuntimeError(f"{process.name} was not ready within {timeout} s:\n{process.tail()}")

    def kill(self, name: str) -> None:
        """SIGKILL the process and all of its children, as a crash or an OOM kill would."""
        process = self.processes.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.popen.pid, signal.SIGKILL)
        process.popen.wait(timeout=30)

    def stop(self, name: str, timeout: float = 20) -> None:
        process = self.processes.pop(name, None)
        if process is None or process.popen.poll() is not None:
            return
        try:
            os.killpg(process.popen.pid, signal.SIGTERM)
            process.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.popen.pid, signal.SIGKILL)
            process.popen.wait(timeout=30)
        except ProcessLookupError:
            pass

    def stop_all(self) -> None:
        for name in list(self.processes):
            self.stop(name)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.tail()}" for p in self.processes.values())


class Api:
    """The JSON API of one web process, as an agent (or a browser's form post) would call it."""

    def __init__(self, base_url: str, token: str) -> None:
        self.client = httpx2.Client(base_url=f"{base_url}/api/v1", timeout=60,
                                    headers={"Authorization": f"Bearer {token}"})

    def post(self, path: str, body: Any, *, expect: int = 201) -> Any:
        response = self.client.post(path, json=body)
        assert response.status_code == expect, (path, response.status_code, response.text)
        return response.json()

    def get(self, path: str) -> Any:
        response = self.client.get(path)
        assert response.status_code == 200, (path, response.status_code, response.text)
        return response.json()

    def close(self) -> None:
        self.client.close()


def ws_url(process: Process, session_id: str) -> str:
    return process.url.replace("http://", "ws://") + f"/probe/sessions/{session_id}/"


class Viewer:
    """A websocket client on a session's probe, reading events on a thread of its own."""

    def __init__(self, url: str) -> None:
        from websockets.sync.client import connect

        self.events: list[dict[str, Any]] = []
        self.closed = False
        self._changed = threading.Condition()
        self._connection = connect(url, open_timeout=10)
        self._socket = self._connection.__enter__()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            for message in self._socket:
                event = json.loads(message)
                event["received_at"] = time.time()
                with self._changed:
                    self.events.append(event)
                    self._changed.notify_all()
        except ConnectionClosed:
            pass
        with self._changed:
            self.closed = True
            self._changed.notify_all()

    def wait_for(self, predicate: Any, timeout: float = 60) -> dict[str, Any]:
        """The first event (old or new) for which ``predicate(event)`` is true."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                found = next((e for e in self.events if predicate(e)), None)
                if found is not None:
                    return found
                if self.closed:
                    raise AssertionError(f"the server closed the websocket; got {self.summary()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no matching event within {timeout} s; got {self.summary()}")
                self._changed.wait(left)

    def run_statuses(self, run_id: int) -> list[str]:
        with self._changed:
            return [e["run"]["status"] for e in self.events if e.get("type") == "run.update" and e["run_id"] == run_id]

    def summary(self) -> list[tuple[str, str]]:
        return [(e.get("type", ""), (e.get("run") or {}).get("status", "")) for e in self.events]

    def close(self) -> None:
        self._connection.__exit__(None, None, None)
        self._thread.join(timeout=10)
