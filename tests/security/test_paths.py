"""Item 1 of the trust boundary: no path from an upload or from stored state leads outside a workspace."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from contextlab.engine.core.errors import MalformedInput
from contextlab.engine.core.paths import UnsafePath, workspace_path
from contextlab.engine.stages.archive import ArchiveLocation, DialogArchive
from contextlab.engine.stages.truncation import OffloadStore
from contextlab.sessions import services
from contextlab.sessions.models import AgentSession, OffloadedFile
from tests.security.conftest import members, zipped


def _archive_files(session: AgentSession) -> dict[Path, int]:
    files = sorted((session.workspace / "dialog").glob("*.jsonl"))
    assert files, "the victim has no archive to protect"
    return {path: path.stat().st_size for path in files}


def _hostile_bundle(own: AgentSession, journal_targets: list[str]) -> bytes:
    """``own``'s export plus a journal of a turn "in flight" that names ``journal_targets``."""
    files = members(services.session_export(session=own))
    journal = {"turn": 10**6, "files": {target: {"bytes": 0, "lines": 0} for target in journal_targets}}
    files["workspace/dialog/.uncommitted.json"] = json.dumps(journal).encode()
    return zipped(files)


def _targets(victim: AgentSession, outside: Path) -> list[str]:
    archive = sorted((victim.workspace / "dialog").glob("*.jsonl"))[0]
    # Relative to the importer's dialog folder: up to the workspaces, into the victim's.
    return [f"../../{victim.id}/dialog/{archive.name}", str(archive), str(outside)]


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "outside-the-data-folder.txt"
    path.write_text("a file the server can write\n" * 100)
    return path


def _assert_untouched(victim: AgentSession, before: dict[Path, int], outside: Path) -> None:
    assert _archive_files(victim) == before
    assert outside.stat().st_size == len("a file the server can write\n") * 100
    # Bob's session still loads and shows its archived originals.
    services.session_prepare(session=victim)


def test_it_keeps_another_users_archive_through_the_service(alice_worked, bob_session, outside):
    before = _archive_files(bob_session)
    bundle = _hostile_bundle(alice_worked, _targets(bob_session, outside))
    copy = services.session_import_bundle(owner=alice_worked.owner, data=bundle)
    services.session_prepare(session=copy)
    _assert_untouched(bob_session, before, outside)
    assert not (copy.workspace / "dialog" / ".uncommitted.json").exists()


def test_it_keeps_another_users_archive_through_the_api(api, alice_worked, bob_session, outside):
    before = _archive_files(bob_session)
    bundle = _hostile_bundle(alice_worked, _targets(bob_session, outside))
    response = api.client.post("/api/v1/imports", {"file": SimpleUploadedFile("b.zip", bundle)},
                               headers=api.headers)
    assert response.status_code == 201, response.content
    copy = AgentSession.objects.get(pk=response.json()["id"])
    services.session_prepare(session=copy)
    _assert_untouched(bob_session, before, outside)


def test_it_keeps_another_users_archive_through_the_import_page(alice_client, alice_worked, bob_session, outside):
    before = _archive_files(bob_session)
    bundle = _hostile_bundle(alice_worked, _targets(bob_session, outside))
    response = alice_client.post("/import/", {"file": SimpleUploadedFile("b.zip", bundle)})
    assert response.status_code == 302, response.content
    copy = AgentSession.objects.exclude(pk__in=[alice_worked.pk, bob_session.pk]).get()
    assert alice_client.get(copy.get_absolute_url()).status_code == 200
    _assert_untouched(bob_session, before, outside)


def test_it_exports_and_imports_only_session_data(alice_worked):
    workspace = alice_worked.workspace
    (workspace / "dialog" / ".uncommitted.json").write_text('{"turn": 1, "files": {}}')
    (workspace / ".hidden").write_text("x")
    (workspace / "notes.txt").write_text("not a workspace file of the engine")
    exported = members(services.session_export(session=alice_worked))
    assert not any("/." in name or name == "workspace/notes.txt" for name in exported)
    exported["workspace/dialog/.uncommitted.json"] = b'{"turn": 99, "files": {}}'
    exported["workspace/etc/passwd"] = b"root:x:0:0"
    exported["workspace/.ssh/authorized_keys"] = b"ssh-ed25519 AAAA"
    copy = services.session_import_bundle(owner=alice_worked.owner, data=zipped(exported))
    kept = sorted(p.relative_to(copy.workspace).as_posix() for p in copy.workspace.rglob("*") if p.is_file())
    assert kept and all(p.split("/")[0] in {"dialog", "tool_result", "externalized", "memory", "backup"}
                        or p == "MEMORY.md" for p in kept), kept


@pytest.mark.parametrize("path", ["/etc/passwd", "../../../etc/passwd", "tool_result/../../x.txt", "notes/x.txt"])
def test_it_refuses_a_bundle_whose_rows_name_files_elsewhere(alice_worked, path):
    files = members(services.session_export(session=alice_worked))
    rows = [json.loads(line) for line in files["offloaded_files.jsonl"].splitlines()]
    assert rows
    rows[0]["path"] = path
    files["offloaded_files.jsonl"] = "".join(json.dumps(r) + "\n" for r in rows).encode()
    with pytest.raises(MalformedInput) as info:
        services.session_import_bundle(owner=alice_worked.owner, data=zipped(files))
    assert info.value.field == "file"
    assert AgentSession.objects.count() == 1


def test_it_never_reads_a_stored_path_outside_the_workspace(alice_client, alice_worked, tmp_path):
    """Rows already stored with a foreign path: the search and the ledger do not open it."""
    secret = tmp_path / "secret.txt"
    secret.write_text("the-needle-of-another-user\n")
    row = OffloadedFile.objects.filter(session=alice_worked).first()
    assert row is not None
    row.path = str(secret)
    row.save(update_fields=["path"])
    response = alice_client.get(reverse("cl-session-search", args=[alice_worked.pk]),
                                {"q": "the-needle-of-another-user"})
    assert response.status_code == 200
    assert b"the-needle-of-another-user</" not in response.content
    assert b"secret.txt:" not in response.content


def test_it_skips_journal_entries_that_are_not_its_own_files(tmp_path):
    workspace = tmp_path / "ws"
    archive = DialogArchive(workspace)
    archive.folder.mkdir(parents=True)
    (archive.folder / "2026-01-01.jsonl").write_text('{"id": "a"}\n')
    victim = tmp_path / "victim.jsonl"
    victim.write_text("keep me\n")
    os.symlink(victim, archive.folder / "2026-01-02.jsonl")
    archive.journal_path.write_text(json.dumps({"turn": 9, "files": {
        "../../victim.jsonl": {"bytes": 0, "lines": 0},
        str(victim): {"bytes": 0, "lines": 0},
        "2026-01-02.jsonl": {"bytes": 0, "lines": 0},  # a symlink out of the folder
        "2026-01-01.jsonl": {"bytes": 0, "lines": 0},  # its own file: cut back as designed
    }}))
    assert archive.recover(committed_turn=1) == ["dialog/2026-01-01.jsonl"]
    assert victim.read_text() == "keep me\n"
    assert not archive.journal_path.exists()


@pytest.mark.parametrize("relative", ["/etc/passwd", "../x", "a/../../x", "", "a\\..\\x", "tool_result/\x00"])
def test_it_refuses_paths_that_leave_the_root(tmp_path, relative):
    with pytest.raises(UnsafePath):
        workspace_path(tmp_path, relative)


def test_it_refuses_a_symlink_out_of_the_root(tmp_path):
    root = tmp_path / "ws"
    (root / "tool_result").mkdir(parents=True)
    os.symlink(tmp_path, root / "tool_result" / "up")
    with pytest.raises(UnsafePath):
        OffloadStore(root).read("tool_result/up/secret.txt")
    with pytest.raises(UnsafePath):
        DialogArchive(root).read(ArchiveLocation("/etc/passwd", 1))
    assert workspace_path(root, "tool_result/./a.txt") == (root / "tool_result" / "a.txt").resolve()
