"""The embedded beat: a thread of the web process that runs the periodic jobs eagerly."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
from django.utils import timezone

from contextlab.celery import app, task
from contextlab.sessions.models import CompactionRun
from contextlab.support import jobs
from tests.conversations import REPO, answer, tool_turn

beats: list[str] = []


@task(name="tests.jobs.tick")
def tick() -> None:
    beats.append(threading.current_thread().name)


@pytest.fixture
def fast_beat(settings, tmp_path):
    settings.CONTEXTLAB_EMBEDDED_BEAT = True
    settings.CELERY_BEAT_SCHEDULE_FILENAME = str(tmp_path / "celerybeat-schedule")
    settings.VAR_DIR = tmp_path
    schedule = app.conf.beat_schedule
    app.conf.beat_schedule = {"tick": {"task": "tests.jobs.tick", "schedule": 0.2}}
    beats.clear()
    yield
    jobs.stop_embedded()
    app.conf.beat_schedule = schedule


@pytest.mark.django_db(transaction=True)
def test_it_starts_the_beat_once_and_recovers_the_runs_of_a_dead_process(fast_beat, alice_session):
    from contextlab.sessions import services

    services.messages_append(session=alice_session, messages=[*tool_turn(1), answer(1), *tool_turn(2)])
    left_running = CompactionRun.objects.create(session=alice_session, status="running", started=timezone.now())
    left_queued = CompactionRun.objects.create(session=alice_session)

    jobs.start_embedded()
    jobs.start_embedded()  # a second call changes nothing
    deadline = time.monotonic() + 10
    while len(beats) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(beats) >= 3
    assert set(beats) == {"Beat"}  # run eagerly, in the beat thread
    assert [t.name for t in threading.enumerate()].count("Beat") == 1

    assert jobs.drain(30)
    left_running.refresh_from_db()
    left_queued.refresh_from_db()
    assert left_running.status == "failed"
    assert left_queued.status == "done"


def test_it_does_not_start_in_scaled_mode(settings):
    settings.CONTEXTLAB_JOBS_MODE = "scaled"
    settings.CONTEXTLAB_EMBEDDED_BEAT = True
    jobs.start_embedded()
    assert "Beat" not in [t.name for t in threading.enumerate()]


@pytest.mark.parametrize(("extra", "started"), [({}, True), ({"REDIS_URL": "redis://127.0.0.1:1/0"}, False),
                                                ({"CONTEXTLAB_EMBEDDED_BEAT": "0"}, False)])
def test_the_asgi_module_starts_it_in_embedded_mode_only(tmp_path, extra, started):
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL", "PYTEST_VERSION")}
    # Scaled mode (REDIS_URL) refuses to start without a secret key of its own.
    env.update({"CONTEXTLAB_VAR_DIR": str(tmp_path), "CONTEXTLAB_EMBEDDED_BEAT": "1",
                "SECRET_KEY": "a-secret-key-for-this-test-only-" + "x" * 30, **extra})
    code = ("import threading, contextlab.asgi; "
            "print('Beat' in [t.name for t in threading.enumerate()]); "
            "from contextlab.support import jobs; jobs.stop_embedded(5)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == str(started)
