"""Observe mode's pending calls (committed, not yet in a session) are taken in without a later call."""

from __future__ import annotations

from django.conf import settings

from contextlab.celery import app
from contextlab.gateway import tasks
from contextlab.gateway.models import ObservedCall
from contextlab.sessions.models import AgentProfile, Turn


def _pending_call(profile: AgentProfile, text: str) -> ObservedCall:
    # What a process killed after answering leaves: the request and the reply, no conversation yet.
    return ObservedCall.objects.create(
        owner=profile.owner, profile=profile, status_code=200, reply_text="Done.",
        body={"model": "gpt-4o", "messages": [{"role": "system", "content": "You are a build engineer."},
                                              {"role": "user", "content": text}]})


def test_the_beat_task_takes_the_pending_calls_into_their_sessions(small_profile) -> None:
    first = _pending_call(small_profile, "Build the shop target and report the warnings.")
    second = _pending_call(small_profile, "Patch the kernel on the staging hosts, one by one.")
    assert tasks.settle_observed_calls() == 2
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.conversation and second.conversation and first.session_id != second.session_id
    assert Turn.objects.filter(session_id__in=[first.session_id, second.session_id]).count() == 2
    assert tasks.settle_observed_calls() == 0  # nothing is taken in twice


def test_the_beat_runs_the_task() -> None:
    entry = settings.CELERY_BEAT_SCHEDULE["settle-observed-calls"]
    app.loader.import_default_modules()
    assert entry["task"] in app.tasks and entry["schedule"] == float(settings.CONTEXTLAB_SETTLE_SECONDS)
