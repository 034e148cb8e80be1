"""Item 5 of the trust boundary: loose input is refused with the field named, never a 500."""

from __future__ import annotations

import json
import socket

import pytest
from channels.db import database_sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser, User

from contextlab.dashboard.routing import websocket_urlpatterns
from contextlab.engine import ContextManager
from contextlab.engine.convert import from_openai
from contextlab.engine.core.errors import InvalidProfile, MalformedInput
from contextlab.engine.core.profile import Profile
from contextlab.sessions import services
from contextlab.sessions.models import AgentProfile, AgentSession
from tests.conversations import answer, tool_turn
from tests.gateway.servers import embedded_only
from tests.security.conftest import members, zipped


def _error(response, status: int = 400) -> dict:
    assert response.status_code == status, response.content
    body = response.json()
    assert body["error"]
    return body


# -- multipart ----------------------------------------------------------------------------


@pytest.mark.parametrize("content_type", ["multipart/form-data", "multipart/form-data; boundary="])
def test_it_answers_a_multipart_body_without_boundary_with_json(api, content_type):
    response = api.client.post("/api/v1/imports", b"--x\r\n", content_type=content_type, headers=api.headers)
    assert _error(response)["field"] == "body"


def test_it_answers_an_empty_multipart_body_with_json(api):
    response = api.client.post("/api/v1/imports", b"", content_type="multipart/form-data; boundary=xyz",
                               headers=api.headers)
    assert _error(response)["field"] == "file"


# -- profiles -----------------------------------------------------------------------------


@pytest.mark.parametrize("knob", ["compaction_base_url", "compaction_model", "compaction_api_key_env", "timezone",
                                  "tokenizer", "policy"])
@pytest.mark.parametrize("value", [None, True, [], {}, 3])
def test_it_refuses_profile_text_settings_that_are_not_strings(api, knob, value):
    response = api.post("/api/v1/profiles", {"name": "p", knob: value})
    assert _error(response, 422)["field"] == knob
    assert not AgentProfile.objects.filter(name="p").exists()


def test_it_refuses_an_unknown_timezone(api):
    response = api.post("/api/v1/profiles", {"name": "p", "timezone": "Mars/Olympus"})
    assert _error(response, 422)["field"] == "timezone"
    with pytest.raises(InvalidProfile) as info:
        Profile(timezone="../../etc/passwd")
    assert info.value.field == "timezone"
    assert api.post("/api/v1/profiles", {"name": "q", "timezone": "Europe/Paris"}).status_code == 201


# -- bundles ------------------------------------------------------------------------------


@pytest.mark.parametrize(("key", "value"), [("engine_state", []), ("engine_state", "x"), ("profile", "name"),
                                            ("profile", [1]), ("session", [])])
def test_it_refuses_a_bundle_whose_parts_have_the_wrong_shape(alice_session, key, value):
    files = members(services.session_export(session=alice_session))
    manifest = json.loads(files["session.json"])
    manifest[key] = value
    files["session.json"] = json.dumps(manifest).encode()
    with pytest.raises(MalformedInput) as info:
        services.session_import_bundle(owner=alice_session.owner, data=zipped(files))
    assert info.value.field == "file"
    assert AgentSession.objects.count() == 1


def test_it_answers_a_bad_bundle_through_the_api_with_400(api, alice_session):
    from django.core.files.uploadedfile import SimpleUploadedFile
    files = members(services.session_export(session=alice_session))
    manifest = json.loads(files["session.json"])
    manifest["engine_state"] = []
    files["session.json"] = json.dumps(manifest).encode()
    response = api.client.post("/api/v1/imports", {"file": SimpleUploadedFile("b.zip", zipped(files))},
                               headers=api.headers)
    assert _error(response)["field"] == "file"


# -- manual compaction under the eviction policy -------------------------------------------


_EVICTING = {"policy": "eviction", "eviction_strategy": "sliding_window", "max_input_length": 4_000, "recent_n": 2,
             "recent_max_bytes": 1_500, "old_max_bytes": 400}


def test_it_compacts_an_eviction_session_by_hand(alice):
    profile = services.profile_create(owner=alice, name="evict", knobs=_EVICTING)
    session = services.session_create(owner=alice, system_prompt="You evict.", profile=profile)
    for i in range(1, 9):
        services.messages_append(session=session, messages=[*([answer(i - 1)] if i > 1 else []),
                                                            *tool_turn(i, output_bytes=2_500)])
        services.session_prepare(session=session)
    session.refresh_from_db()
    assert "evicted-" in json.dumps(session.engine_state), "no eviction placeholder is live"
    run = services.compaction_run(session=session)
    assert run.status == "done", run.error
    services.session_prepare(session=session)


def test_it_compacts_eviction_placeholders_in_the_engine(tmp_path):
    manager = ContextManager(Profile(**_EVICTING), tmp_path)
    for i in range(1, 9):
        manager.append(from_openai([*([answer(i - 1)] if i > 1 else []), *tool_turn(i, output_bytes=2_500)],
                                   known_calls={}))
        manager.prepare()
    placeholders = [m.id for m in manager.messages if m.id.startswith("evicted-")]
    assert placeholders
    result = manager.compact()
    assert result.trace.outcome == "compacted"
    assert not set(placeholders) & {m.id for m in manager.messages}


# -- websockets ---------------------------------------------------------------------------

pytestmark_ws = pytest.mark.django_db(transaction=True)


@database_sync_to_async
def _owned_session(name: str) -> tuple[User, AgentSession]:
    user = User.objects.create_user(name, f"{name}@example.org", "pw")
    return user, services.session_create(owner=user, system_prompt="ws")


def _socket(session: AgentSession, user) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), f"/ws/sessions/{session.pk}/")
    communicator.scope["user"] = user
    return communicator


@pytestmark_ws
@pytest.mark.parametrize("frame", ['{"type":"catch_up","after":1e400}', '{"type":"catch_up","after":-1e400}',
                                   '{"type":"catch_up","after":1,"messages":1e400}',
                                   "[" * 5_000 + "]" * 5_000, '{"type":' * 1_500 + "1" + "}" * 1_500,
                                   '{"type":"ping"}'])
async def test_it_keeps_the_socket_open_after_odd_frames(frame):
    user, session = await _owned_session("alice")
    socket = _socket(session, user)
    connected, _ = await socket.connect()
    assert connected
    await socket.send_to(text_data=frame)
    # Still alive: a well-formed catch-up after the odd frame is answered. A crash
    # on the odd frame would surface here as the consumer's exception.
    await socket.send_to(text_data='{"type":"catch_up","after":0,"messages":0}')
    outputs = [await socket.receive_output(timeout=5)]
    while not await socket.receive_nothing(timeout=0.3):
        outputs.append(await socket.receive_output())
    assert all(output["type"] == "websocket.send" for output in outputs), outputs
    await socket.disconnect()


@pytestmark_ws
@pytest.mark.parametrize(("who", "code"), [("anonymous", 4401), ("stranger", 4403)])
async def test_it_refuses_a_socket_with_its_close_code_after_accepting(who, code):
    _, session = await _owned_session("alice")
    user = AnonymousUser() if who == "anonymous" else (await _owned_session("bob"))[0]
    socket = _socket(session, user)
    connected, _ = await socket.connect()
    # Accepted first: a close before the accept reaches the browser as an HTTP 403.
    assert connected
    assert await socket.receive_output() == {"type": "websocket.close", "code": code}


def test_profiles_saved_with_an_unknown_timezone_load_as_utc(alice_session):
    from importlib import import_module

    from django.apps import apps

    AgentProfile.objects.filter(pk=alice_session.profile.pk).update(timezone="Mars/Olympus")
    migration = import_module("contextlab.sessions.migrations.0004_12a_unknown_timezones_to_utc")
    migration.unknown_to_utc(apps, None)
    profile = AgentProfile.objects.get(pk=alice_session.profile.pk)
    assert profile.timezone == "UTC"
    assert profile.to_engine().timezone == "UTC"


# -- a refused websocket under the real server ---------------------------------------------


@embedded_only
def test_a_refused_websocket_gets_its_close_code_not_an_http_403(server):
    """Under daphne a close before the accept becomes an HTTP 403, which the page takes for a network error."""
    base = server.url.removesuffix("/v1")
    host, port = base.removeprefix("http://").split(":")
    path = "/ws/sessions/00000000-0000-4000-8000-000000000000/"
    handshake = (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 f"Origin: http://127.0.0.1:{port}\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                 "Sec-WebSocket-Version: 13\r\n\r\n").encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(handshake)
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += sock.recv(4096)
        head, _, rest = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101"), head
        while len(rest) < 4:
            rest += sock.recv(4096)
    # A close frame (opcode 8) whose payload starts with the close code.
    assert rest[0] & 0x0F == 0x8
    assert int.from_bytes(rest[2:4], "big") == 4401
