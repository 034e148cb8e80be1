"""The real Codex CLI (npm ``@openai/codex``, pinned) through the gateway, headless, in both modes.

Only the model is scripted (``responses_upstream``): Codex itself runs for real,
executes the shell command the model asks for in a temporary folder, sends the
output back, compacts its context when the reported usage passes its limit,
and continues in a second ``codex exec resume`` run. ``scripts/install_agent_clis.sh``
installs the pinned CLI into ``var/npm`` (the test command runs it).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from contextlab.gateway.models import GatewayExchange, ObservedCall, UpstreamProvider
from contextlab.sessions import services
from contextlab.sessions.models import AgentProfile, AgentSession
from contextlab.support import providers
from tests.gateway.responses_upstream import Reply, Request, ResponsesUpstream, function_call, text

REPO = Path(__file__).resolve().parents[2]
CODEX = Path(os.environ.get("CONTEXTLAB_CODEX_BIN") or REPO / "var" / "npm" / "node_modules" / ".bin" / "codex")
SUMMARY = "SUMMARY: the user asked what notes.txt says; it says alpha-7 (read with cat)."
COMPACT_LIMIT = 2_000

pytestmark = pytest.mark.skipif(not CODEX.exists(), reason=f"Codex CLI not installed at {CODEX}: run "
                                                             "scripts/install_agent_clis.sh")


def _last_user_text(items: list[dict[str, Any]]) -> str:
    for item in reversed(items):
        if item.get("type") == "message" and item.get("role") == "user":
            content = item.get("content")
            return content if isinstance(content, str) else "".join(p.get("text", "") for p in content)
    return ""


def brain(request: Request) -> Reply:
    """What a model would answer Codex: read a file, answer; compact when asked; list files, answer."""
    body = request.body
    items = body.get("input") or []
    if body.get("tools") == []:
        return Reply([text(SUMMARY)], input_tokens=900)
    last = items[-1]
    if last.get("type") == "function_call_output":
        if "alpha-7" in str(last.get("output")):
            # Usage over the auto-compact limit: Codex compacts before its next turn.
            return Reply([text("notes.txt says alpha-7.")], input_tokens=COMPACT_LIMIT * 3)
        return Reply([text("The folder holds notes.txt.")], input_tokens=800)
    asked = _last_user_text(items)
    if "notes.txt say" in asked:
        return Reply([function_call("exec_command", {"cmd": "cat notes.txt"})], input_tokens=700)
    if "which files" in asked:
        return Reply([function_call("exec_command", {"cmd": "ls"})], input_tokens=700)
    return Reply([text("I do not know.")])


def _codex_home(folder: Path, base_url: str) -> Path:
    home = folder / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text(f"""
model = "gpt-5-codex"
model_provider = "contextlab"
approval_policy = "never"
sandbox_mode = "danger-full-access"
model_auto_compact_token_limit = {COMPACT_LIMIT}
model_context_window = 200000
check_for_update_on_startup = false

[analytics]
enabled = false

[model_providers.contextlab]
name = "ContextLab"
base_url = "{base_url}"
env_key = "CONTEXTLAB_TOKEN"
wire_api = "responses"
# Codex then first tries a WebSocket on GET /v1/responses: the gateway's 426 sends it to HTTP.
supports_websockets = true
request_max_retries = 0
stream_max_retries = 0
# The user has several routed profiles: this one names Codex's.
http_headers = {{ "X-ContextLab-Profile" = "codex" }}
""", encoding="utf-8")
    return home


def _run_codex(workdir: Path, home: Path, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("OPENAI_", "CODEX_"))}
    env.update({"CODEX_HOME": str(home), "CONTEXTLAB_TOKEN": token, "NO_COLOR": "1"})
    return subprocess.run([str(CODEX), "exec", "--skip-git-repo-check", *args], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL, check=False)


@pytest.fixture
def codex_profile(alice) -> AgentProfile:
    # Another routed profile: without the profile header Codex's calls would be refused as ambiguous.
    other = services.profile_create(owner=alice, name="other", knobs={})
    UpstreamProvider.objects.create(profile=other, base_url="http://127.0.0.1:9/v1", timeout=5)
    # Codex's own instructions are about 10,000 tokens: a window that holds them.
    return services.profile_create(owner=alice, name="codex", knobs={"max_input_length": 200_000})


def _session(upstream: ResponsesUpstream, gateway_url: str, alice_token: str, profile: AgentProfile,
             mode: str, folder: Path) -> tuple[list[subprocess.CompletedProcess[str]], Path]:
    UpstreamProvider.objects.create(profile=profile, base_url=upstream.base_url, mode=mode, timeout=60,
                                    api_key=providers.encrypt_secret("sk-upstream"))
    workdir = folder / "work"
    workdir.mkdir()
    (workdir / "notes.txt").write_text("alpha-7\n", encoding="utf-8")
    home = _codex_home(folder, gateway_url)
    first = _run_codex(workdir, home, alice_token, "What does notes.txt say?")
    second = _run_codex(workdir, home, alice_token, "resume", "--last", "And which files are in this folder?")
    return [first, second], folder


def _assert_codex_ran(runs: list[subprocess.CompletedProcess[str]], upstream: ResponsesUpstream) -> None:
    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
    assert "alpha-7" in runs[0].stdout
    assert "notes.txt" in runs[1].stdout
    posts = upstream.posts
    # The real tool outputs flowed back to the model through the gateway.
    outputs = [i for r in posts for i in r.body["input"] if i.get("type") == "function_call_output"]
    assert any("alpha-7" in str(o.get("output")) for o in outputs)
    assert any("notes.txt" in str(o.get("output")) for o in outputs)
    # Codex compacted on its own, with its checkpoint prompt and no tools.
    compactions = [r for r in posts if r.body.get("tools") == []]
    assert len(compactions) == 1
    assert "CONTEXT CHECKPOINT COMPACTION" in json.dumps(compactions[0].body["input"][-1])
    # The request after it carries the summary instead of the tool calls.
    after = posts[posts.index(compactions[0]) + 1].body["input"]
    assert any(SUMMARY in json.dumps(i) for i in after)
    assert not any(i.get("type") == "function_call" and "cat notes.txt" in i.get("arguments", "") for i in after)


def test_it_observes_the_real_codex_cli(gateway_url, alice_token, codex_profile, tmp_path):
    with ResponsesUpstream(brain) as upstream:
        runs, _ = _session(upstream, gateway_url, alice_token, codex_profile, UpstreamProvider.Mode.OBSERVE,
                           tmp_path)
        _assert_codex_ran(runs, upstream)
        calls = list(ObservedCall.objects.order_by("pk"))
    assert len(calls) == len(upstream.posts)
    assert {c.endpoint for c in calls} == {"responses"}
    assert all(c.status_code == 200 and not c.error for c in calls), [c.error for c in calls]
    assert [c.kind for c in calls].count("compaction.local") == 1
    # Observe mode: the agent's bytes went upstream unchanged.
    assert [c.body for c in calls] == [r.body for r in upstream.posts]
    # One conversation, named by Codex's thread (kept as the calls' client id, not as a
    # ContextLab session header); its compaction request is a side call of it.
    assert len({c.client_id for c in calls}) == 1 and calls[0].client_id and not calls[0].session_header
    sessions = list(AgentSession.objects.filter(source__format="observed"))
    assert len(sessions) == 1, [s.title for s in sessions]
    session = sessions[0]
    assert session.title == "What does notes.txt say?"  # the user's words, not Codex's environment context
    assert {c.session_id for c in calls} == {session.pk}
    compactor = next(c for c in calls if c.kind == "compaction.local")
    assert compactor.side_call
    assert sum(1 for c in calls if not c.side_call) == len(calls) - 1
    # The tool call and its real output, paired in the session.
    contents = json.dumps([m.content for m in session.messages.order_by("seq")])
    assert '"tool_use"' in contents and '"tool_result"' in contents and "alpha-7" in contents
    # Codex's compaction, recognised: its summary replaced the tool call, output and answer.
    fired = {t.number: {x["step"]: x for x in t.trace["steps"] if x["status"] == "fired"}
             for t in session.turns.order_by("number")}
    compacted = [number for number, steps in fired.items() if "summary" in steps]
    assert len(compacted) == 1
    steps = fired[compacted[0]]
    assert steps["context_check"]["outcome"] == "3 message(s) left the context"
    compactor_seq = list(ObservedCall.objects.filter(profile=codex_profile).order_by("pk")).index(compactor) + 1
    assert steps["summary"]["details"]["compactor"] == f"side call, request {compactor_seq}"


def test_it_manages_the_real_codex_cli(gateway_url, alice_token, codex_profile, tmp_path):
    with ResponsesUpstream(brain) as upstream:
        runs, _ = _session(upstream, gateway_url, alice_token, codex_profile, UpstreamProvider.Mode.MANAGE,
                           tmp_path)
        _assert_codex_ran(runs, upstream)
    exchanges = list(GatewayExchange.objects.order_by("created"))
    assert len(exchanges) == len(upstream.posts)
    assert {e.endpoint for e in exchanges} == {"responses"}
    assert all(e.status_code == 200 for e in exchanges)
    compaction = [e for e in exchanges if not e.managed]
    assert len(compaction) == 1 and "compaction" in compaction[0].error
    # One session: the first run, its compaction forwarded as it came, then the request after the
    # compaction continues that same session with its context replaced by what Codex sent.
    assert [(e.managed, e.identity) for e in exchanges] == [
        (True, "new"), (True, "continued"), (False, ""), (True, "compacted"), (True, "continued")]
    first = exchanges[0].session
    assert first is not None and {e.session for e in exchanges} == {first}
    assert AgentSession.objects.filter(profile=codex_profile).count() == 1
    assert "compacted its own context just before this request (local compaction)" in exchanges[3].error
    first.refresh_from_db()
    assert first.turns_count == 4
    adopted = first.turns.get(number=3)
    assert (adopted.trigger, adopted.outcome) == ("agent", "compacted")
    step = next(s for s in adopted.trace["steps"] if s["step"] == "agent_compaction")
    assert (step["details"]["agent"], step["details"]["kind"]) == ("Codex", "local compaction")
    assert SUMMARY in step["details"]["summary"] and not step["details"]["opaque"]
    # The tool call, its output and the answer were replaced: their ids are named there.
    assert step["numbers"]["replaced"] >= 3
    summary = first.summary_versions.get()
    assert (summary.trigger, summary.compactor) == ("agent", "Codex") and SUMMARY in summary.text
    # Reasoning-free but verbatim: with nothing to cut in a 200,000-token window, the
    # items Codex sent reached the provider as it sent them.
    assert all(e.upstream_messages == e.client_messages for e in exchanges if e.managed)
    assert upstream.posts[0].body["input"][-1]["content"][0]["text"] == "What does notes.txt say?"
    roles = list(first.messages.order_by("seq").values_list("role", flat=True))
    assert roles[:3] == ["user", "user", "assistant"]
    assert "alpha-7" in json.dumps([m.content for m in first.messages.all()])


def test_it_flags_codex_compacting_before_every_request(gateway_url, alice_token, codex_profile, tmp_path):
    """Every answer reports usage over Codex's limit: it compacts before each of its next requests."""
    commands = iter(["cat notes.txt", "ls", "wc -l notes.txt"])

    def thrashing(request: Request) -> Reply:
        if request.body.get("tools") == []:
            return Reply([text(f"{SUMMARY} Step {len(upstream.posts)}.")], input_tokens=900)
        command = next(commands, None)
        if command is None:
            return Reply([text("notes.txt says alpha-7.")], input_tokens=800)
        return Reply([function_call("exec_command", {"cmd": command})], input_tokens=COMPACT_LIMIT * 3)

    with ResponsesUpstream(thrashing) as upstream:
        UpstreamProvider.objects.create(profile=codex_profile, base_url=upstream.base_url, timeout=60,
                                        mode=UpstreamProvider.Mode.OBSERVE,
                                        api_key=providers.encrypt_secret("sk-upstream"))
        folder = tmp_path
        workdir = folder / "work"
        workdir.mkdir()
        (workdir / "notes.txt").write_text("alpha-7\n", encoding="utf-8")
        run = _run_codex(workdir, _codex_home(folder, gateway_url), alice_token, "What does notes.txt say?")
    assert run.returncode == 0, run.stderr[-3000:]
    calls = list(ObservedCall.objects.order_by("pk"))
    assert [c.kind for c in calls].count("compaction.local") == 3
    session = AgentSession.objects.get(source__format="observed")
    losses = [loss for turn in session.turns.order_by("number") for loss in turn.trace["copaw_losses"]]
    thrash = [loss for loss in losses if loss["name"] == "compaction_thrash"]
    assert thrash, losses
    assert "a compaction before each of the last 3 requests" in thrash[-1]["detail"]
