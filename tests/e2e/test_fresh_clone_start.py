"""A newcomer's first minute, the way CI meets it: a fresh clone, the real start script, a browser.

The repository under test (its committed HEAD) is cloned into a temporary
folder with ``shared`` beside it, as CI lays it out. ``scripts/start.sh`` runs
there for real: it creates the clone's own ``.venv`` (pip, from its cache: a
minute or two), installs the tokenizer files, migrates, loads the demo and
serves. Chromium then logs in and opens the demo session: its stylesheet,
htmx, the websocket and the tokens chart must all work, with no request
failing (favicon included). The scaled mode is checked in the same clone: the
start script against a PostgreSQL database creates no demo login, and the
Procfile's roles, started the way the README says, serve the same page.

Progress is printed as it goes, since a first start takes a while.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.browser import CHROMIUM, LAUNCH_ARGS, needs_chromium
from tests.scaled.deployment import (
    MAINTENANCE_URL,
    TEST_REDIS_URL,
    _database_url,
    delete_redis_keys,
    drop_database,
    free_port,
)

HERE = Path(__file__).resolve().parent
# A newcomer's environment has none of the variables the test run set.
NEWCOMER_DROPS = ("CONTEXTLAB_", "DJANGO_", "PYTEST", "VIRTUAL_ENV", "PYTHONPATH", "DATABASE_URL", "REDIS_URL",
                  "SECRET_KEY")
FIRST_START_SECONDS = 900  # a new virtualenv and every package, from pip's cache
START_SECONDS = 180

pytestmark = [needs_chromium, pytest.mark.browser]

Say = Callable[[str], None]


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The committed HEAD of the repository under test, cloned, with ``shared`` beside it."""
    top = Path(_git("rev-parse", "--show-toplevel", cwd=HERE))
    head = _git("rev-parse", "HEAD", cwd=top)
    folder = tmp_path_factory.mktemp("fresh-clone")
    target = folder / "contextlab"
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(top), str(target)], check=True)
    # HEAD itself, whichever branch (or none) the repository under test is on.
    _git("fetch", "--quiet", "origin", "HEAD", cwd=target)
    _git("checkout", "--quiet", "--detach", "FETCH_HEAD", cwd=target)
    assert _git("rev-parse", "HEAD", cwd=target) == head
    shared = top.parent / "shared"
    if shared.exists():
        (folder / "shared").symlink_to(shared.resolve(), target_is_directory=True)
    return target


@pytest.fixture
def say(capsys: pytest.CaptureFixture[str]) -> Say:
    def _say(text: str) -> None:
        with capsys.disabled():
            print(f"\n[fresh clone {time.strftime('%H:%M:%S')}] {text}", flush=True)

    return _say


def newcomer_env(clone: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(NEWCOMER_DROPS)}
    # Not the test run's virtualenv: the clone makes its own.
    outer_venv = str(Path(_git("rev-parse", "--show-toplevel", cwd=HERE)) / ".venv")
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(outer_venv))
    env["CONTEXTLAB_OPEN_BROWSER"] = "0"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


class Started:
    """A command of the clone running in a process group of its own, its output in a file."""

    def __init__(self, name: str, argv: list[str], clone: Path, env: dict[str, str]) -> None:
        self.name = name
        self.log = clone.parent / f"{name}.log"
        with self.log.open("ab") as handle:
            self.popen = subprocess.Popen(argv, cwd=clone, env=env, stdout=handle, stderr=subprocess.STDOUT,
                                          start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.output().splitlines()[-lines:])

    def wait_until_it_answers(self, url: str, timeout: float, say: Say) -> None:
        deadline = time.monotonic() + timeout
        next_news = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                pytest.fail(f"{self.name} exited with {self.popen.returncode}:\n{self.tail()}")
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/healthz", timeout=2) as response:
                if response.status == 200:
                    return
            if time.monotonic() > next_news:
                last = (self.output().strip().splitlines() or ["(no output yet)"])[-1]
                say(f"{self.name}: still starting; last line: {last[:160]}")
                next_news += 30
            time.sleep(0.5)
        pytest.fail(f"{self.name} did not answer {url} within {timeout:.0f} s:\n{self.tail()}")

    def stop(self) -> None:
        if self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout=20)
        # Children that outlived the leader (a celery pool) are still in the group.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)


@pytest.fixture
def processes() -> Iterator[list[Started]]:
    started: list[Started] = []
    yield started
    for process in reversed(started):
        process.stop()


def _log_in(page, base: str, username: str, password: str) -> None:
    page.goto(f"{base}/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")


def check_the_session_page(base: str, username: str, password: str, screenshot: Path) -> None:
    """Log in, open the (only) session, and check that CSS, htmx, the websocket and the chart work."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            failed: list[str] = []
            errors: list[str] = []
            page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
            page.on("requestfailed", lambda r: failed.append(f"failed {r.url}"))
            page.on("pageerror", lambda error: errors.append(str(error)))
            _log_in(page, base, username, password)
            page.wait_for_url(f"{base}/")
            session_url = page.get_attribute('table a[href^="/sessions/"]', "href")
            assert session_url, "the sessions list shows no session"
            page.goto(f"{base}{session_url}", wait_until="load")
            # Only app.css paints the top bar this colour.
            topbar = page.evaluate("getComputedStyle(document.querySelector('.topbar')).backgroundColor")
            assert topbar == "rgb(21, 26, 38)", f"the stylesheet did not apply (top bar: {topbar}); failed: {failed}"
            assert page.evaluate("typeof window.htmx === 'object' && typeof window.htmx.ajax === 'function'"), (
                f"htmx did not load; failed: {failed}")
            # The page marks the socket "live" when htmx's websocket extension has opened it.
            page.wait_for_selector('#live-state[data-state="live"]', timeout=30_000)
            page.wait_for_selector("#chart-canvas .uplot canvas", timeout=15_000)
            size = page.evaluate("(() => { const c = document.querySelector('#chart-canvas .uplot canvas');"
                                 " const box = c.getBoundingClientRect(); return [box.width, box.height]; })()")
            assert size[0] > 200 and size[1] > 100, f"the tokens chart has no size: {size}"
            page.screenshot(path=str(screenshot), full_page=False)
            assert not failed, f"requests that failed: {failed}"
            assert not errors, f"script errors: {errors}"
        finally:
            browser.close()


def test_it_serves_a_styled_live_dashboard_from_a_fresh_clone_with_the_start_script(clone, say, processes):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    say(f"cloned into {clone}; running PORT={port} bash scripts/start.sh (a first start installs everything)")
    start = Started("start-embedded", ["bash", "scripts/start.sh"], clone, newcomer_env(clone, PORT=str(port)))
    processes.append(start)
    start.wait_until_it_answers(base, FIRST_START_SECONDS, say)
    assert "log in as demo / demo" in start.output()
    say("answering; checking the demo session page in Chromium")
    screenshot = clone.parent / "embedded-session.png"
    check_the_session_page(base, "demo", "demo", screenshot)
    say(f"embedded mode works (screenshot: {screenshot})")


def test_it_serves_the_same_page_from_the_procfile_roles_in_scaled_mode(clone, say, processes):
    import psycopg
    import redis

    name = f"contextlab_fresh_{secrets.token_hex(4)}"
    prefix = f"{name}:"
    try:
        with psycopg.connect(MAINTENANCE_URL, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        redis.Redis.from_url(TEST_REDIS_URL, socket_connect_timeout=5).ping()
    except Exception as exc:
        pytest.fail(f"scaled mode needs PostgreSQL and Redis: {exc}", pytrace=False)
    # As the README's deployment part says: a shared database needs the operator's secret key.
    scaled = {"DATABASE_URL": _database_url(name), "REDIS_URL": TEST_REDIS_URL, "CONTEXTLAB_REDIS_PREFIX": prefix,
              "SECRET_KEY": secrets.token_urlsafe(50)}
    try:
        # 1. The start script on a shared database: it migrates, but creates no well-known login.
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        say(f"scaled: DATABASE_URL=…/{name} PORT={port} bash scripts/start.sh")
        start = Started("start-shared-db", ["bash", "scripts/start.sh"], clone,
                        newcomer_env(clone, PORT=str(port), **scaled))
        processes.append(start)
        start.wait_until_it_answers(base, FIRST_START_SECONDS, say)
        with psycopg.connect(_database_url(name)) as conn:
            row = conn.execute("SELECT count(*) FROM auth_user WHERE username = 'demo'").fetchone()
        assert row == (0,), "start.sh created the demo login on a shared database"
        assert "no demo login on a shared database" in start.output()
        from playwright.sync_api import sync_playwright

        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS, headless=True)
            page = browser.new_page()
            _log_in(page, base, "demo", "demo")
            page.wait_for_selector(".form-error")
            browser.close()
        start.stop()

        # 2. A real account, as the README says, and the demo session for it.
        env = newcomer_env(clone, **scaled)
        password = secrets.token_urlsafe(12)
        manage = [str(clone / ".venv" / "bin" / "python"), "manage.py"]
        subprocess.run([*manage, "createsuperuser", "--noinput", "--username", "admin", "--email",
                        "admin@example.org"], cwd=clone, env={**env, "DJANGO_SUPERUSER_PASSWORD": password},
                       check=True, capture_output=True, timeout=120)
        subprocess.run([*manage, "loaddemo", "--owner", "admin"], cwd=clone, env=env, check=True,
                       capture_output=True, timeout=300)

        # 3. The Procfile's long-running roles, as the README starts them.
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        say(f"scaled: PORT={port} honcho start web worker beat")
        roles = Started("honcho", [str(clone / ".venv" / "bin" / "honcho"), "start", "web", "worker", "beat"], clone,
                        # A trial over plain HTTP, as docs/scaled-mode.md says: no TLS proxy here.
                        {**env, "PORT": str(port), "CONTEXTLAB_WORKER_CONCURRENCY": "1", "CONTEXTLAB_HTTPS": "0",
                         "PATH": os.pathsep.join([str(clone / ".venv" / "bin"), env["PATH"]])})
        processes.append(roles)
        roles.wait_until_it_answers(base, START_SECONDS, say)
        screenshot = clone.parent / "scaled-session.png"
        check_the_session_page(base, "admin", password, screenshot)
        # The admin, with its own static files, opens for that account.
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS, headless=True)
            page = browser.new_page()
            failed: list[str] = []
            page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
            _log_in(page, base, "admin", password)
            page.wait_for_url(f"{base}/")
            page.goto(f"{base}/admin/contextlab_sessions/agentprofile/")
            assert page.locator("#result_list").count() == 1
            browser.close()
            assert not failed, f"requests that failed: {failed}"
        say(f"scaled mode works (screenshot: {screenshot})")
    finally:
        for process in processes:
            process.stop()
        drop_database(name)
        delete_redis_keys(prefix)
