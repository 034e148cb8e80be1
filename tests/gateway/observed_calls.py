"""Observe mode answers first and rebuilds the session after: what a test reads once the answer is in."""

from __future__ import annotations

from typing import Any

from contextlab.gateway import observe
from contextlab.gateway.models import ObservedCall


def drained() -> None:
    """Wait until the gateway has rebuilt the sessions of every call it answered (no sleeping: it
    waits on the calls in flight, which the gateway registers before answering)."""
    assert observe.recording_drained(timeout=60), "the observed calls were not rebuilt after their answers"


def session_of(answer: Any) -> str:
    """The id of the session the answered call was taken into (the answer names the call)."""
    drained()
    return str(ObservedCall.objects.get(pk=answer.headers["X-ContextLab-Call"]).session_id)
