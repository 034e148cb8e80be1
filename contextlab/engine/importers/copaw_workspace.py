"""Import a CoPaw (1.0.x) agent workspace, a folder or a zip of one, read-only.

What a workspace holds (the agent's ``~/.copaw/workspaces/<id>/``):

* ``agent.json``: its ``running`` config, which becomes a ``copaw`` profile with
  the same knobs;
* ``sessions/*.json``: the live memory (AgentScope message dicts) and the current
  ``_compressed_summary``;
* ``dialog/*.jsonl``: every archived message, one per line, in archive order;
* ``tool_result/*.txt``: offloaded tool outputs, named by the notices that point at them;
* ``compact_invalid_*.json``: compactions whose summary was rejected (CoPaw still
  removed the messages and erased the summary);
* ``memory/*.md`` and ``MEMORY.md``: what its memory summariser wrote.

The workspace alone does not say where one compaction's archive ends and the
next begins; the agent's request log does. With the requests (``requests``),
the observe inference (``contextlab.engine.observe.inference``) gives each compaction its
request, trigger and turn, and the dialog lines are assigned to them in order.

A zip is never trusted: member names are checked (no absolute paths, no ``..``,
no links), and the number of members and the bytes actually read are capped,
whatever the archive's headers claim. Everything read from the workspace and its
requests (every JSON file, every dialog line, the tool-result and memory files)
counts against one ``ParseBudget``, the upload's when a server passes one.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import stat
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from contextlab.engine.core.errors import InputTooLarge, MalformedInput
from contextlab.engine.core.profile import LANGUAGES, Profile
from contextlab.engine.importers import json_stream
from contextlab.engine.importers.json_stream import JsonSyntaxError, ParseBudget, bounded_lines, load_line
from contextlab.engine.observe.inference import Observer, RecordedRequest, load_recorded_request

MAX_MEMBERS = 20_000
MAX_MEMBER_BYTES = 64 * 1024 * 1024
MAX_TOTAL_BYTES = 512 * 1024 * 1024
REPORT_KEYS: tuple[str, ...] = (
    "profile", "live_messages", "archived_messages", "compactions", "manual_compactions", "invalid_compactions",
    "summary_erased", "tool_results", "truncated_tool_results", "losses",
)
_NOTICE = "<<<TRUNCATED>>>"
_TOOL_FILE = re.compile(r"tool_result/([0-9a-f]{32})\.txt")
_NAMED_PATH = re.compile(r"file_path=\{?([^\s}]+)")


# -- reading a folder or a zip safely ---------------------------------------------------------

def _safe_member_name(name: str) -> PurePosixPath | None:
    """The member's relative path, or None when it points outside the folder."""
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or any(part in ("..", "") for part in path.parts) or ":" in path.parts[0]:
        return None
    return path


@dataclass(frozen=True)
class UnpackBudget:
    """How much an archive may unpack to, each member and in all, and what sets each limit (for the messages).

    A server passes limits tied to the upload's size, so that a small archive
    cannot unpack into gigabytes that the import would then parse and hold.
    """

    member_bytes: int = MAX_MEMBER_BYTES
    total_bytes: int = MAX_TOTAL_BYTES
    member_text: str = "the limit for one member of an archive"
    total_text: str = "the limit for an archive"


def safe_extract(archive_path: Path, target: Path, *, max_members: int = MAX_MEMBERS,
                 budget: UnpackBudget | None = None) -> list[str]:
    """Extract regular files only, each within ``target``; returns the members skipped, with why.

    Members are unpacked one at a time in pieces, each piece counted against the
    member's budget and the archive's before it is written.
    """
    budget = budget or UnpackBudget()
    max_member_bytes, max_total_bytes = budget.member_bytes, budget.total_bytes
    skipped: list[str] = []
    total = 0
    try:
        archive = zipfile.ZipFile(archive_path)
    except zipfile.BadZipFile as exc:
        raise MalformedInput(f"not a zip archive: {exc}", field="file") from exc
    with archive:
        members = archive.infolist()
        if len(members) > max_members:
            raise MalformedInput(f"the archive holds {len(members):,} members, more than {max_members:,}",
                                 field="file")
        for info in members:
            if info.is_dir():
                continue
            relative = _safe_member_name(info.filename)
            mode = info.external_attr >> 16
            if relative is None or stat.S_ISLNK(mode):
                skipped.append(f"{info.filename}: outside the folder or a link")
                continue
            destination = target.joinpath(*relative.parts)
            destination.parent.mkdir(parents=True, exist_ok=True)
            written = 0
            # The header's sizes are the sender's claim; count what decompresses.
            with archive.open(info) as source, destination.open("wb") as sink:
                while chunk := source.read(1024 * 1024):
                    written += len(chunk)
                    total += len(chunk)
                    if written > max_member_bytes:
                        raise InputTooLarge(f"{info.filename} unpacks to more than {max_member_bytes:,} bytes "
                                            f"({budget.member_text})", field="file")
                    if total > max_total_bytes:
                        raise InputTooLarge(f"the archive unpacks to more than {max_total_bytes:,} bytes "
                                            f"({budget.total_text})", field="file")
                    sink.write(chunk)
    return skipped


def _root_holding(folder: Path, names: tuple[str, ...]) -> Path:
    """``folder`` or the one folder inside it (a zip of a folder) that holds one of ``names``."""
    if any((folder / n).exists() for n in names):
        return folder
    children = [c for c in folder.iterdir() if c.is_dir() and not c.name.startswith((".", "__MACOSX"))]
    for child in children:
        if any((child / n).exists() for n in names):
            return child
    return folder


@contextlib.contextmanager
def opened_folder(path: str | Path, markers: tuple[str, ...], budget: UnpackBudget | None = None) -> Iterator[Path]:
    """A folder to read: the folder itself, or a zip unpacked (safely, within ``budget``) into a temporary one."""
    source = Path(path)
    if source.is_dir():
        yield _root_holding(source, markers)
        return
    if not source.is_file():
        raise FileNotFoundError(2, "No such file or directory", str(source))
    scratch = Path(tempfile.mkdtemp(prefix="contextlab-import-"))
    try:
        safe_extract(source, scratch, budget=budget)
        yield _root_holding(scratch, markers)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def folder_budget(folder: Path) -> ParseBudget:
    """The budget of a folder read on its own (no upload sets one): set by its files' total size."""
    return ParseBudget.for_size(sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()), "the folder")


def _read_json(path: Path, what: str, budget: ParseBudget) -> Any:
    """One JSON file, parsed as it is read within the upload's memory budget."""
    try:
        with path.open("rb") as fh:
            return json_stream.load(fh, where=f"in {what}", budget=budget)
    except InputTooLarge:
        raise
    except (MalformedInput, JsonSyntaxError) as exc:
        reason = exc.message if isinstance(exc, MalformedInput) else str(exc)
        raise MalformedInput(f"{what} is not valid JSON: {reason}", field="file") from exc


def _read_bytes(path: Path, what: str, budget: ParseBudget) -> bytes:
    """A file kept whole (a tool output, a memory file): its size counts against ``budget`` before it is read."""
    budget.spend(path.stat().st_size + sys.getsizeof(b""), f"in {what}")
    return path.read_bytes()


# -- the request log ---------------------------------------------------------------------------

def read_request_folder(folder: Path, budget: ParseBudget | None = None) -> list[RecordedRequest]:
    """Every ``*.json`` request record (or bare request body), in file-name order, all within ``budget``."""
    budget = budget or folder_budget(folder)
    requests: list[RecordedRequest] = []
    for index, path in enumerate(sorted(p for p in folder.rglob("*.json") if p.is_file()), start=1):
        data = _read_json(path, path.name, budget)
        if isinstance(data, dict) and isinstance(data.get("body", data).get("messages"), list):
            requests.append(load_recorded_request(data, index))
    if not requests:
        raise MalformedInput("the folder holds no chat-completions request (a JSON file with messages)",
                             field="file")
    return requests


def _dialog_lines(path: Path, budget: ParseBudget) -> Iterator[tuple[int, Any]]:
    """The JSON values of a dialog file's lines as (1-based line, value), one at a time; a line that
    is not JSON gives ``None``. Lines past the line limit, or values past ``budget``, are refused."""
    what = f"dialog/{path.name}"
    with path.open("rb") as fh:
        for number, offset, raw in bounded_lines(fh, budget, what):
            if not raw.strip():
                continue
            try:
                yield number, load_line(raw, where=f"in {what} line {number}", budget=budget, offset=offset)
            except InputTooLarge:
                raise
            except (MalformedInput, JsonSyntaxError):
                yield number, None


def observe_requests(requests: list[RecordedRequest]) -> Observer:
    observer = Observer()
    for request in requests:
        observer.observe(request)
    return observer


# -- the workspace -----------------------------------------------------------------------------

@dataclass
class ToolResult:
    id: str
    name: str
    turn: int
    where: str  # "dialog/<file> line N" or "live"
    bytes: int
    notice: bool
    file_named: str = ""  # the tool_result file the notice points at
    original_file: str = ""  # a tool_result file holding the full output
    original_bytes: int = 0
    silent_cut: bool = False

    @property
    def truncated(self) -> bool:
        return self.notice or self.silent_cut

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "turn": self.turn, "where": self.where, "bytes": self.bytes,
                "notice": self.notice, "file_named": self.file_named, "original_file": self.original_file,
                "original_bytes": self.original_bytes, "silent_cut": self.silent_cut}


@dataclass
class CopawWorkspace:
    folder_name: str
    profile: dict[str, Any]
    live_messages: list[dict[str, Any]]
    summary: str
    archived: list[dict[str, Any]]  # {"file", "line", "message"}
    tool_files: dict[str, bytes]
    invalid_compactions: list[dict[str, Any]]
    memory: dict[str, str]
    system_prompt: str = ""
    warnings: list[str] = field(default_factory=list)


def profile_from_running(agent: dict[str, Any]) -> dict[str, Any]:
    """The ``copaw`` profile knobs that ``agent.json``'s ``running`` config sets."""
    found = agent.get("running")
    running: dict[str, Any] = found if isinstance(found, dict) else {}
    compact = running.get("context_compact") or {}
    tools = running.get("tool_result_compact") or {}
    knobs: dict[str, Any] = {"policy": "copaw"}
    pairs = (("max_input_length", running, "max_input_length", int),
             ("compact_ratio", compact, "memory_compact_ratio", float),
             ("reserve_ratio", compact, "memory_reserve_ratio", float),
             ("estimate_divisor", compact, "token_count_estimate_divisor", float),
             ("recent_n", tools, "recent_n", int),
             ("old_max_bytes", tools, "old_max_bytes", int),
             ("recent_max_bytes", tools, "recent_max_bytes", int),
             ("retention_days", tools, "retention_days", int))
    for knob, section, key, kind in pairs:
        if isinstance(section, dict) and isinstance(section.get(key), int | float):
            knobs[knob] = kind(section[key])
    language = agent.get("language") or running.get("language")
    if language in LANGUAGES:
        knobs["summary_language"] = language
    Profile.from_dict(knobs)  # the engine's bounds: a workspace cannot smuggle in a broken profile
    return knobs


# What an archived line costs besides its message: the entry's dict, its file name and line number.
_ARCHIVED_COST = 64 + 184 + 32


def read_workspace(folder: Path, budget: ParseBudget | None = None) -> CopawWorkspace:
    """The workspace in ``folder``; what it reads counts against ``budget`` (by default, the folder's size)."""
    budget = budget or folder_budget(folder)
    warnings: list[str] = []
    agent_path = folder / "agent.json"
    agent = _read_json(agent_path, "agent.json", budget) if agent_path.is_file() else {}
    if not agent_path.is_file():
        warnings.append("no agent.json: the profile has CoPaw's defaults")
    profile = profile_from_running(agent if isinstance(agent, dict) else {})
    live: list[dict[str, Any]] = []
    summary = ""
    system_prompt = ""
    session_files = sorted((folder / "sessions").glob("*.json")) if (folder / "sessions").is_dir() else []
    for path in session_files:
        data = _read_json(path, f"sessions/{path.name}", budget)
        agent_state = data.get("agent") if isinstance(data, dict) else None
        memory = agent_state.get("memory") if isinstance(agent_state, dict) else None
        if not isinstance(memory, dict):
            warnings.append(f"sessions/{path.name}: no agent memory")
            continue
        for entry in memory.get("content") or []:
            message = entry[0] if isinstance(entry, list) and entry else entry
            if isinstance(message, dict):
                live.append(message)
        summary = str(memory.get("_compressed_summary") or summary)
        system_prompt = str(agent_state.get("_sys_prompt") or system_prompt) if isinstance(agent_state, dict) else ""
    if len(session_files) > 1:
        warnings.append(f"{len(session_files)} session files: their live messages are read in name order")
    archived: list[dict[str, Any]] = []
    dialog = folder / "dialog"
    for path in sorted(dialog.glob("*.jsonl")) if dialog.is_dir() else []:
        for number, message in _dialog_lines(path, budget):
            if message is None:
                warnings.append(f"dialog/{path.name} line {number} is not JSON")
                continue
            if isinstance(message, dict):
                budget.spend(_ARCHIVED_COST, f"in dialog/{path.name} line {number}")
                archived.append({"file": f"dialog/{path.name}", "line": number, "message": message})
    tool_dir = folder / "tool_result"
    tool_files = ({p.name: _read_bytes(p, f"tool_result/{p.name}", budget) for p in sorted(tool_dir.glob("*.txt"))}
                  if tool_dir.is_dir() else {})
    invalid = []
    for path in sorted(folder.glob("compact_invalid_*.json")):
        data = _read_json(path, path.name, budget)
        if isinstance(data, dict):
            invalid.append({"file": path.name, "reply": str(data.get("history_compact", "")),
                            "prompt_chars": len(str(data.get("user_message", "")))})
    memory_texts: dict[str, str] = {}
    for path in [folder / "MEMORY.md", *sorted((folder / "memory").glob("*.md"))]:
        if path.is_file():
            what = str(path.relative_to(folder))
            # As read_text() reads it: universal newlines.
            text = _read_bytes(path, what, budget).decode("utf-8", errors="replace")
            memory_texts[what] = text.replace("\r\n", "\n").replace("\r", "\n")
    return CopawWorkspace(folder_name=folder.name, profile=profile, live_messages=live, summary=summary,
                          archived=archived, tool_files=tool_files, invalid_compactions=invalid,
                          memory=memory_texts, system_prompt=system_prompt, warnings=warnings)


# -- the analysis ------------------------------------------------------------------------------

def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _output_text(block: dict[str, Any]) -> str:
    output = block.get("output")
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return "".join(str(p.get("text", "")) for p in output if isinstance(p, dict))
    return ""


def _tool_results(workspace: CopawWorkspace) -> list[ToolResult]:
    rows: list[ToolResult] = []
    turn = 0
    located = [(f"{a['file']} line {a['line']}", a["message"]) for a in workspace.archived]
    located += [("live", m) for m in workspace.live_messages]
    for where, message in located:
        if message.get("role") == "user":
            turn += 1
        for block in _blocks(message):
            if block.get("type") != "tool_result":
                continue
            text = _output_text(block)
            data = text.encode("utf-8")
            row = ToolResult(id=str(block.get("id", "")), name=str(block.get("name", "")), turn=turn, where=where,
                             bytes=len(data), notice=_NOTICE in text)
            if row.notice:
                notice = text[text.index(_NOTICE):]
                named = _TOOL_FILE.search(notice)
                pointed = _NAMED_PATH.search(notice)
                row.file_named = pointed.group(1) if pointed else ""
                if named:
                    row.file_named = f"tool_result/{named.group(1)}.txt"
                    if f"{named.group(1)}.txt" in workspace.tool_files:
                        row.original_file = row.file_named
                        row.original_bytes = len(workspace.tool_files[f"{named.group(1)}.txt"])
            elif data:
                # A cut with no notice (CoPaw's cut inside an output's last line): an
                # offloaded file that starts with what is left and goes on with no newline.
                for name, original in workspace.tool_files.items():
                    if (len(original) > len(data) and original.startswith(data)
                            and b"\n" not in original[max(0, len(data) - 1):]):
                        row.silent_cut = True
                        row.original_file = f"tool_result/{name}"
                        row.original_bytes = len(original)
                        break
            rows.append(row)
    return rows


def _turn_of_messages(workspace: CopawWorkspace) -> list[int]:
    turns: list[int] = []
    turn = 0
    for message in [a["message"] for a in workspace.archived] + workspace.live_messages:
        if message.get("role") == "user":
            turn += 1
        turns.append(turn)
    return turns


def analyse(workspace: CopawWorkspace, observer: Observer | None = None) -> dict[str, Any]:
    """The report: ``REPORT_KEYS`` first, then the detail (compactions, tool results, summaries)."""
    tool_rows = _tool_results(workspace)
    losses: list[dict[str, Any]] = []
    for row in tool_rows:
        if row.truncated and row.where != "live":
            kept = f"the archive keeps {row.bytes:,} bytes of a cut output"
            losses.append({"kind": "archive_truncated_text", "turn": row.turn, "detail": (
                f"{row.where}: {row.name} {row.id}: {kept}; the original "
                + (f"({row.original_bytes:,} bytes) is only in {row.original_file}" if row.original_file
                   else f"is the file its notice names, {row.file_named}" if row.file_named
                   else "is not in the workspace"))})
        if row.silent_cut:
            losses.append({"kind": "silent_single_line_cut", "turn": row.turn, "detail": (
                f"{row.name} {row.id} was cut to {row.bytes:,} bytes with no notice; {row.original_file} "
                f"({row.original_bytes:,} bytes) is named nowhere in the context")})
    for invalid in workspace.invalid_compactions:
        losses.append({"kind": "failed_summary_drops_messages", "turn": None, "detail": (
            f"{invalid['file']}: the summary was rejected (no '##' in the reply), yet the messages were removed "
            "and the previous summary erased")})
    compactions: list[dict[str, Any]] = []
    summaries: list[dict[str, Any]] = []
    erased = 0
    conversation = None
    if observer is not None:
        agents = [c for c in observer.conversations.values() if c.requests]
        conversation = max(agents, key=lambda c: len(c.requests)) if agents else None
    if conversation is not None:
        line = 0
        for compaction in conversation.compactions:
            archived = workspace.archived[line:line + compaction["dropped"]]
            line += compaction["dropped"]
            compactions.append({**compaction, "archived": [f"{a['file']} line {a['line']}" for a in archived]})
            if compaction["summary_erased"]:
                erased += 1
                losses.append({"kind": "failed_summary_drops_messages", "turn": compaction.get("turn"), "detail": (
                    f"request {compaction['seq']}: {compaction['dropped']} messages removed and the summary "
                    "erased, with no summary in their place")})
        if line != len(workspace.archived):
            workspace.warnings.append(f"the requests show {line} archived messages, the dialog files hold "
                                      f"{len(workspace.archived)}")
        for observation in conversation.observations:
            for event in observation.events:
                if event.kind == "turn_split":
                    losses.append({"kind": "turn_split", "turn": observation.turn, "detail": (
                        f"request {observation.seq}: the compaction kept the turn's {event.detail['first_kept_role']} "
                        "messages and archived the user message they answer")})
        summaries = [dict(s) for s in conversation.summaries]
    else:
        erased = len(workspace.invalid_compactions)
        if workspace.live_messages and workspace.live_messages[0].get("role") != "user" and workspace.archived:
            losses.append({"kind": "turn_split", "turn": _turn_of_messages(workspace)[len(workspace.archived)],
                           "detail": "the live memory starts with a "
                           f"{workspace.live_messages[0].get('role')} message whose user message was archived"})
        if workspace.archived:
            workspace.warnings.append("without the request log, where one compaction's archive ends and the next "
                                      "begins is unknown: compactions counts the evidence only")
    manual = sum(1 for c in compactions if c.get("trigger") == "manual")
    count = len(compactions) if conversation is not None else (
        len(workspace.invalid_compactions) + (1 if workspace.summary or workspace.archived else 0))
    invalid_count = max(len(workspace.invalid_compactions), erased)
    losses.sort(key=lambda x: (x["turn"] is None, x["turn"] or 0))
    report: dict[str, Any] = {
        "profile": workspace.profile,
        "live_messages": len(workspace.live_messages),
        "archived_messages": len(workspace.archived),
        "compactions": count,
        "manual_compactions": manual,
        "invalid_compactions": invalid_count,
        "summary_erased": erased,
        "tool_results": len(tool_rows),
        "truncated_tool_results": sum(1 for r in tool_rows if r.truncated),
        "losses": losses,
        "dialog_lines": {name: sum(1 for a in workspace.archived if a["file"] == name)
                         for name in dict.fromkeys(a["file"] for a in workspace.archived)},
        "tool_result_files": len(workspace.tool_files),
        "summary": workspace.summary,
        "summaries": summaries,
        "compaction_detail": compactions,
        "tool_result_detail": [r.to_dict() for r in tool_rows],
        "memory_files": sorted(workspace.memory),
        "requests": len(observer_requests(observer)) if observer is not None else 0,
        "warnings": workspace.warnings,
    }
    return report


def observer_requests(observer: Observer) -> list[int]:
    seqs: list[int] = []
    for conversation in observer.conversations.values():
        seqs += conversation.requests + [s.seq for s in conversation.side_calls]
    return sorted(seqs)


WORKSPACE_MARKERS = ("agent.json", "sessions", "dialog")
REQUEST_MARKERS = ("requests",)


def import_copaw_workspace(path: str | Path, requests: str | Path | None = None) -> tuple[CopawWorkspace,
                                                                                          dict[str, Any]]:
    """Read a workspace (folder or zip) and, if given, its request log (folder or zip); return both and the report."""
    with opened_folder(path, WORKSPACE_MARKERS) as folder:
        if not any((folder / n).exists() for n in WORKSPACE_MARKERS):
            raise MalformedInput("not a CoPaw workspace: no agent.json, sessions/ or dialog/", field="file")
        workspace = read_workspace(folder)
    observer = None
    if requests is not None:
        with opened_folder(requests, REQUEST_MARKERS) as folder:
            inner = folder / "requests" if (folder / "requests").is_dir() else folder
            observer = observe_requests(read_request_folder(inner))
    return workspace, analyse(workspace, observer)


def render_report(report: dict[str, Any]) -> str:
    """The report for people, a few lines."""
    profile = ", ".join(f"{k}={v}" for k, v in report["profile"].items())
    lines = [
        f"profile: {profile}",
        f"messages: {report['live_messages']} live, {report['archived_messages']} archived "
        f"({', '.join(f'{k}: {v} lines' for k, v in report['dialog_lines'].items()) or 'no dialog file'})",
        f"compactions: {report['compactions']} ({report['manual_compactions']} manual, "
        f"{report['invalid_compactions']} invalid, {report['summary_erased']} summary erased)",
    ]
    for c in report["compaction_detail"]:
        lines.append(f"  request {c['seq']} (turn {c.get('turn')}): {c['trigger']}, {c['dropped']} archived, "
                     f"{c['kept']} kept" + (f", summary v{c['summary_version']}" if c["summary_version"] else
                                            ", summary erased"))
    lines.append(f"tool results: {report['tool_results']}, {report['truncated_tool_results']} truncated, "
                 f"{report['tool_result_files']} files in tool_result/")
    lines.append(f"losses: {len(report['losses'])}")
    for loss in report["losses"]:
        lines.append(f"  turn {loss['turn']}: {loss['kind']}: {loss['detail']}")
    for warning in report["warnings"]:
        lines.append(f"warning: {warning}")
    return "\n".join(lines)
