"""Scaled mode (PostgreSQL, Redis, uvicorn): a turn answered is a turn recorded, through kill -9 right after
the answer, in observe mode and in manage mode.

The web process serves ``tests.gateway.killed_after_answer`` (the deployed
application, armed to SIGKILL itself at the first moment after a call's answer:
see there), then a plain web process is started on the same database.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from tests.gateway.provider import Answer, Provider, scripted
from tests.scaled.conftest import skip_unless_scaled
from tests.scaled.deployment import Deployment, Unavailable

pytestmark = skip_unless_scaled

SETUP = """
import json
from django.contrib.auth.models import User
from contextlab.gateway.models import UpstreamProvider
from contextlab.sessions.models import AgentProfile
alice = User.objects.get(username="alice")
for mode in ("observe", "manage"):
    profile = AgentProfile.objects.create(owner=alice, name=mode, max_input_length=100000)
    UpstreamProvider.objects.create(profile=profile, base_url={base_url!r}, api_key="sk-upstream", mode=mode,
                                    timeout=60)
print("null")
"""

# Per profile: the observed calls not yet in a session, and each turn's number and payload.
STATE = """
import json
from contextlab.gateway.models import ObservedCall
from contextlab.sessions.models import Turn
print(json.dumps({mode: {
    "pending": ObservedCall.objects.filter(profile__name=mode, status_code=200, conversation="").count(),
    "turns": [[t.number, json.dumps(t.payload)] for t in Turn.objects.filter(session__profile__name=mode)
              .order_by("session_id", "number")],
} for mode in ("observe", "manage")}))
"""

OPENING = [{"role": "system", "content": "You are a build engineer."},
           {"role": "user", "content": "Build the shop target and report the warnings."}]


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    deployment = Deployment(tmp_path)
    try:
        deployment.create()
    except Unavailable as exc:
        pytest.fail(f"CONTEXTLAB_SCALED_TESTS=1 but {exc}", pytrace=False)
    try:
        deployment.api_token()
        yield deployment
    finally:
        deployment.destroy()


def _call(deployment: Deployment, url: str, mode: str) -> bytes:
    answer = httpx2.post(f"{url}/v1/chat/completions", json={"model": "gpt-4o", "messages": OPENING},
                         headers={"Authorization": f"Bearer {deployment.token}", "X-ContextLab-Profile": mode},
                         timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.content


@pytest.mark.parametrize("mode", ["observe", "manage"])
def test_a_turn_answered_before_a_kill_is_in_its_session_after_the_restart(deployment: Deployment,
                                                                          mode: str) -> None:
    with Provider(scripted(Answer("Built; two warnings in build.log."))) as provider:
        deployment.python(SETUP.format(base_url=provider.base_url))
        web = deployment.start_web("web", app="tests.gateway.killed_after_answer:application")
        assert b"two warnings" in _call(deployment, web.url, mode)
        assert web.popen.wait(timeout=30) == -signal.SIGKILL
        left = deployment.python(STATE)[mode]
        # Observe mode answered with the call committed as pending; manage mode wrote the turn first.
        assert (left["pending"], len(left["turns"])) == ((1, 0) if mode == "observe" else (0, 1))
        deployment.start_web("web")  # settles what was left pending while the application loads
        state = deployment.python(STATE)[mode]
    assert state["pending"] == 0
    assert [number for number, _ in state["turns"]] == [1]
    assert "Build the shop target" in state["turns"][0][1]
