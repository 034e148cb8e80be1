"""Screenshots of every insight page, for the docs (``CONTEXTLAB_SCREENSHOTS=1``).

Drives Debian's Chromium through Playwright against pytest-django's live
server; the pages are filled with a session that has a plan, failures, a
stale read, a compaction with memory notes, two consolidations and a
comparison, so the screenshots show the pages as they look in use.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
from pathlib import Path

import pytest
from django.test import Client

from contextlab.engine.memory.long_term import MemoryNotes, append_daily_note, consolidate
from contextlab.insights import services as insights
from contextlab.sessions import services
from tests.conversations import answer, tool_turn
from tests.corpus import corpus_path
from tests.insights.conftest import call, result

OUT = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
CHROMIUM = shutil.which("chromium")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(os.getenv("CONTEXTLAB_SCREENSHOTS") != "1", reason="set CONTEXTLAB_SCREENSHOTS=1"),
    pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed"),
]

TRACEBACK = """============================= test session starts ==============================
collected 14 items

tests/test_dates.py ....F.........                                       [100%]

=================================== FAILURES ===================================
___________________________ test_parse_local_midnight __________________________
    def test_parse_local_midnight():
>       assert parse_day("2026-03-29T00:30", zone="Europe/Berlin") == date(2026, 3, 29)
E       AssertionError: assert datetime.date(2026, 3, 28) == datetime.date(2026, 3, 29)
FAILED tests/test_dates.py::test_parse_local_midnight - AssertionError
[The command completed with exit code 1.]"""


def _working_session(owner, profile):
    session = services.session_create(owner=owner, system_prompt="You are a careful coding agent.",
                                      profile=profile, title="Fix the DST bug in parse_day")
    todos = [{"content": "Reproduce the failing test", "status": "completed"},
             {"content": "Fix parse_day for local midnight", "status": "in_progress"},
             {"content": "Run the whole suite", "status": "pending"}]
    services.messages_append(session=session, messages=[
        {"role": "user", "content": "parse_day returns the wrong date around the DST switch in Berlin. "
                                    "Please always run the tests with pytest -q. Don't touch the public API."},
        call("t1", "write_todos", {"todos": todos}, "Planning the fix."),
        result("t1", "Todos updated."),
        call("c1", "bash", {"command": "pytest -q tests/test_dates.py"}),
        result("c1", TRACEBACK),
        call("c2", "read_file", {"path": "src/dates.py"}),
        result("c2", "def parse_day(value, zone):\n    return datetime.fromisoformat(value).date()\n"),
        call("c3", "edit_file", {"path": "src/dates.py", "old": "fromisoformat(value)",
                                 "new": "fromisoformat(value).replace(tzinfo=ZoneInfo(zone))"}),
        result("c3", "Error: old text not found in src/dates.py (it appears 0 times)"),
        call("c4", "write_file", {"path": "src/dates.py",
                                  "content": "def parse_day(value, zone):\n    return localise(value, zone).date()\n"}),
        result("c4", "wrote 2 lines to src/dates.py"),
        call("c5", "bash", {"command": "pytest -q"}),
        result("c5", "..............                                       [100%]\n14 passed in 0.41s\n"
                     "[The command completed with exit code 0.]"),
        {"role": "assistant", "content": "Fixed: parse_day localises before taking the date; 14 tests pass."},
    ])
    return session


def _memory_history(session) -> None:
    workspace = session.workspace
    (workspace / "MEMORY.md").write_text(
        "# Long-term memory\n\nNotes this agent keeps across sessions.\n\n## Preferences\n"
        "- I like short commit messages\n", encoding="utf-8")
    day = dt.date.today() - dt.timedelta(days=2)
    append_daily_note(workspace, MemoryNotes(["Always use UTC in logs", "I prefer spaces over tabs"],
                                             ["bash `pip install -e .` failed with \"No network\"; "
                                              "bash `pip install --no-index -f wheels -e .` worked"]),
                      day=day, now=dt.datetime.combine(day, dt.time(10, 12)))
    consolidate(workspace, today=day, now=dt.datetime.combine(day, dt.time(23, 59, 58)))
    append_daily_note(workspace, MemoryNotes(["Never force-push to main"]), day=day + dt.timedelta(days=1),
                      now=dt.datetime.combine(day + dt.timedelta(days=1), dt.time(16, 40)))


def _compacted(owner, profile):
    session = services.session_create(owner=owner, system_prompt="You are a build agent.", profile=profile,
                                      title="Nightly build, all targets")
    messages = [{"role": "user", "content": "I prefer tabs over spaces in every Makefile. Build every target."},
                {"role": "assistant", "content": "Noted: tabs in Makefiles."}]
    for i in range(1, 9):
        messages += [*tool_turn(i, output_bytes=1_400), answer(i)]
    messages.append({"role": "user", "content": "Now write the release notes."})
    services.messages_append(session=session, messages=messages)
    services.session_prepare(session=session)
    return session


def _cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def _shoot(page, url: str, name: str) -> None:
    response = page.goto(url)
    assert response is not None and response.status == 200, url
    page.wait_for_load_state("networkidle")
    page.screenshot(path=str(OUT / f"insights-{name}.png"), full_page=True)


def test_it_takes_a_screenshot_of_every_page(live_server, alice, small_profile):
    from playwright.sync_api import sync_playwright

    # Everything the database needs happens first: Playwright's sync API runs an
    # event loop in this thread, where Django refuses ORM calls.
    working = _working_session(alice, small_profile)
    compacted = _compacted(alice, small_profile)
    _memory_history(compacted)
    evicting = services.profile_create(owner=alice, name="evicting", knobs={
        "policy": "eviction", "max_input_length": 4_000, "recent_n": 2, "recent_max_bytes": 1_500,
        "old_max_bytes": 400})
    tau = services.transcript_import(owner=alice, path=corpus_path(
        "tau-bench/gpt-4o-airline.idx52.task2.trial1.json"), profile=evicting, title="tau-bench airline, task 2")
    insights.compare_run(session=tau)
    cookie = _cookie(alice)
    base = live_server.url
    OUT.mkdir(parents=True, exist_ok=True)

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        context = browser.new_context(viewport={"width": 1360, "height": 900})
        context.add_cookies([{"name": "sessionid", "value": cookie, "url": base}])
        page = context.new_page()
        _shoot(page, f"{base}/sessions/{working.id}/insights/operations/", "operations")
        _shoot(page, f"{base}/sessions/{working.id}/insights/stale/", "stale")
        page.goto(f"{base}/sessions/{compacted.id}/insights/memory/")
        # "Consolidate now" through the page, as a person would: the diff appears in place.
        page.click("button:has-text('Consolidate now')")
        page.wait_for_selector("#consolidation .ins-diff")
        page.wait_for_load_state("networkidle")
        page.screenshot(path=str(OUT / "insights-memory.png"), full_page=True)
        _shoot(page, f"{base}/profiles/{small_profile.id}/memory/", "profile-memory")
        _shoot(page, f"{base}/sessions/{compacted.id}/insights/recall?q=t2.log+errors", "recall")
        _shoot(page, f"{base}/sessions/{tau.id}/insights/compare/", "compare")
        browser.close()
