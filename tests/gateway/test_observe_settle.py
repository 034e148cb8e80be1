"""Observe mode's pending calls (committed, not yet in a session) are taken in without a later call."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from django.conf import settings
from django.test import Client

from contextlab.celery import app
from contextlab.gateway import observe, tasks
from contextlab.gateway.models import ObservedCall, UpstreamProvider
from contextlab.sessions.models import AgentProfile, Turn
from tests.gateway.provider import Answer, scripted


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


def test_a_call_rebuilt_before_the_one_answered_just_before_it_keeps_the_order(small_profile, alice_token,
                                                                             provider) -> None:
    # Answering first, two calls of one conversation back to back: the second's
    # rebuild may run before the first's (another process, or the first's process
    # killed). Each rebuild takes in every pending call in the order they were
    # committed: the first turn stays first.
    UpstreamProvider.objects.create(profile=small_profile, base_url=provider.base_url, api_key="sk-up",
                                    mode=UpstreamProvider.Mode.OBSERVE, timeout=30)
    provider.responder = scripted(Answer("Fixed both."))
    opening = [{"role": "system", "content": "You are a build engineer."},
               {"role": "user", "content": "Build the shop target and report the warnings."}]
    first = ObservedCall.objects.create(owner=small_profile.owner, profile=small_profile, status_code=200,
                                        reply_text="Built; two warnings.", body={"model": "gpt-4o",
                                                                                  "messages": opening})
    second = [*opening, {"role": "assistant", "content": "Built; two warnings."},
              {"role": "user", "content": "Fix both warnings, then build again."}]
    answer = Client().post("/v1/chat/completions", {"model": "gpt-4o", "messages": second},
                           content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {alice_token}")
    assert answer.status_code == 200
    first.refresh_from_db()
    latest = ObservedCall.objects.get(pk=answer["X-ContextLab-Call"])
    assert first.session_id == latest.session_id is not None
    turns = list(Turn.objects.filter(session_id=first.session_id).order_by("number").values_list("number", "payload"))
    assert [number for number, _ in turns] == [1, 2]
    assert "Fix both warnings" not in str(turns[0][1]) and "Fix both warnings" in str(turns[1][1])


def test_calls_answered_while_their_profile_is_rebuilt_join_the_next_round_of_that_rebuild(monkeypatch) -> None:
    # Answering first, calls can come faster than their profile's rebuilds (one at a
    # time): each call's thread must not wait for the rebuild in progress, holding a
    # database connection, but leave its call to the thread at work.
    rounds: list[tuple[str, list[int]]] = []
    inside, release = threading.Event(), threading.Event()

    def rebuilt(batch) -> None:
        rounds.append((threading.current_thread().name, [call.pk for call, _ in batch]))
        if len(rounds) == 1:
            inside.set()
            release.wait()

    monkeypatch.setattr(observe, "_rebuilt", rebuilt)
    calls = [SimpleNamespace(pk=pk, profile_id=7) for pk in (1, 2, 3)]
    for call in calls:
        observe._in_flight.add(call.pk)
    first = threading.Thread(target=observe._rebuild_after_answer, args=(calls[0], None), name="first")
    first.start()
    inside.wait()
    observe._rebuild_after_answer(calls[1], None)  # returns at once: the first thread takes it in
    observe._rebuild_after_answer(calls[2], None)
    assert rounds == [("first", [1])]
    release.set()
    first.join()
    assert rounds == [("first", [1]), ("first", [2, 3])]
    assert observe.recording_drained(timeout=0)
