"""Workspace files: text only, inside the session's workspace only, owner only."""

from __future__ import annotations

import json

from contextlab.sessions.models import SessionMessage


def _url(session, path):
    return f"{session.get_absolute_url()}files/{path}"


def test_it_serves_an_offloaded_output_as_plain_text(alice_client, worked_session):
    file = worked_session.offloaded_files.first()
    response = alice_client.get(_url(worked_session, file.path))
    assert response.status_code == 200
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert "sandbox" in response["Content-Security-Policy"]
    body = b"".join(response.streaming_content).decode()
    assert body == (worked_session.workspace / file.path).read_text()


def test_it_serves_one_archive_record_by_line(alice_client, worked_session):
    message = SessionMessage.objects.filter(session=worked_session, status="archived").order_by("seq").first()
    response = alice_client.get(_url(worked_session, message.archive_file), {"line": message.archive_line})
    assert response.status_code == 200
    text = response.content.decode()
    assert text.startswith(f"{message.archive_file}, line {message.archive_line}")
    record = json.loads(text.split("\n\n", 1)[1])
    assert record["id"] == message.message_id
    assert alice_client.get(_url(worked_session, message.archive_file), {"line": 99_999}).status_code == 404


def test_it_never_leaves_the_workspace(alice_client, worked_session, alice_session, settings, tmp_path):
    secret = settings.WORKSPACES_DIR / "secret.txt"
    secret.write_text("do not serve")
    outside = tmp_path / "outside.txt"
    outside.write_text("nope")
    (worked_session.workspace / "link.txt").symlink_to(outside)
    for path in ("../secret.txt", "..%2Fsecret.txt", "dialog/../../secret.txt", str(secret), "link.txt",
                 "tool_result", "missing.txt", "%00"):
        response = alice_client.get(_url(worked_session, path))
        assert response.status_code == 404, path


def test_it_refuses_another_users_files(bob_client, worked_session):
    file = worked_session.offloaded_files.first()
    assert bob_client.get(_url(worked_session, file.path)).status_code == 404
