"""SWE-agent trajectories (``.traj``): ``{"history", "trajectory", "info", ...}``.

``history`` is already chat-shaped (system/user/assistant/tool). Its own keys
(``thought``, ``action``, ``agent``, ``message_type``, ``is_demo``) are kept in
``metadata["swe_agent"]``; a tool message names its call in ``tool_call_ids``
(a list), and one observation answering several calls is given to the first of
them, the others pointing back to it. ``trajectory`` (per-step environment
state) is not what the model saw and is not imported.

A run in function-calling mode (``replay_config.agent.tools.parse_function.type``
is ``function_calling``) sent its commands as tool definitions. The trajectory
keeps them only as ``command_docs``, the text SWE-agent renders from the same
command list (per command its docstring, then ``- name (type) [required]:
description`` per argument); the definitions are rebuilt from that text, one
function per command with its docstring as description and its arguments as
parameters, and carried in ``Transcript.tools``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from contextlab.engine.importers._common import (
    Source,
    Timeline,
    Transcript,
    finish_transcript,
    recorded_tools,
)
from contextlab.engine.importers.message_list import OpenAIRecord, convert_openai_records

FORMAT = "swe_agent"
_CHAT_KEYS = ("role", "content", "name", "tool_calls")
# A command starts at a bare "name:" line followed by its indented docstring or
# signature (a docstring may itself hold "Tips:"-like lines at column 0).
_COMMAND = re.compile(r"^([A-Za-z_][\w-]*):\n  (?:docstring|signature):", re.MULTILINE)
_ARGUMENT = re.compile(r"^\s+- (\S+) \(([^)]*)\) \[(required|optional)\]: ?(.*)$", re.MULTILINE)


def matches(source: Source) -> bool:
    value = source.value
    return (
        source.kind == "json"
        and isinstance(value, dict)
        and isinstance(value.get("history"), list)
        and bool(value["history"])
        and all(isinstance(m, dict) and "role" in m for m in value["history"][:3])
    )


def _records(history: list[Any], warnings: list[str]) -> list[OpenAIRecord]:
    out: list[OpenAIRecord] = []
    for index, item in enumerate(history):
        base_id = f"{FORMAT}-{index}"
        if not isinstance(item, dict):
            out.append(OpenAIRecord(index, item))  # the converter names the bad field
            continue
        chat = {k: item[k] for k in _CHAT_KEYS if k in item}
        if chat.get("role") == "assistant" and not chat.get("tool_calls"):
            chat.pop("tool_calls", None)  # SWE-agent writes [] or null on plain turns
        own = {k: v for k, v in item.items() if k not in _CHAT_KEYS and k not in ("tool_call_ids", "tool_call_id")}
        meta = {"swe_agent": own} if own else {}
        ids = item.get("tool_call_ids") or ([item["tool_call_id"]] if item.get("tool_call_id") else [])
        if chat.get("role") == "tool" and isinstance(ids, list) and ids:
            first = str(ids[0])
            out.append(OpenAIRecord(index, {**chat, "tool_call_id": first}, msg_id=base_id, metadata=meta))
            for n, other in enumerate(ids[1:], start=1):
                warnings.append(
                    f"history[{index}] answers several calls at once; {other!r} gets a pointer to {first!r}"
                )
                pointer = {"role": "tool", "tool_call_id": str(other), "content": f"[the output is in the result of {first}]"}
                out.append(OpenAIRecord(index, pointer, msg_id=f"{base_id}#{n}", metadata=meta))
            continue
        out.append(OpenAIRecord(index, chat, msg_id=base_id, metadata=meta))
    return out


def _tools_config(value: dict[str, Any]) -> dict[str, Any] | None:
    config = value.get("replay_config")
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except ValueError:
            return None
    agent = config.get("agent") if isinstance(config, dict) else None
    tools = agent.get("tools") if isinstance(agent, dict) else None
    return tools if isinstance(tools, dict) else None


def tools_from_command_docs(docs: str) -> list[dict[str, Any]]:
    """The function definitions a function-calling run sent, rebuilt from ``command_docs``."""
    starts = list(_COMMAND.finditer(docs))
    tools: list[dict[str, Any]] = []
    for number, start in enumerate(starts):
        end = starts[number + 1].start() if number + 1 < len(starts) else len(docs)
        body = docs[start.start() + len(start.group(1)) + 2:end]  # after "name:\n"
        docstring = ""
        found = re.search(r"^  docstring: (.*?)(?=^  signature:|^  arguments:|\Z)", body, re.MULTILINE | re.DOTALL)
        if found:
            docstring = found.group(1).strip()
        properties: dict[str, Any] = {}
        required: list[str] = []
        arguments = body.split("\n  arguments:", 1)
        for arg in _ARGUMENT.finditer(arguments[1] if len(arguments) > 1 else ""):
            name, kind, need, description = arg.groups()
            properties[name] = {"type": kind, "description": description.strip()}
            if need == "required":
                required.append(name)
        tools.append({"type": "function", "function": {
            "name": start.group(1), "description": docstring,
            "parameters": {"type": "object", "properties": properties, "required": required}}})
    return tools


def _recorded_tools(value: dict[str, Any], warnings: list[str]) -> list[dict[str, Any]]:
    config = _tools_config(value)
    if config is None:
        return []
    parse = config.get("parse_function")
    docs = config.get("command_docs")
    if not isinstance(parse, dict) or parse.get("type") != "function_calling" or not isinstance(docs, str):
        return []  # the commands went into the prompt text, not as tool definitions
    return recorded_tools(tools_from_command_docs(docs), "replay_config.agent.tools.command_docs", warnings)


def load(source: Source) -> Transcript:
    value: dict[str, Any] = source.value
    warnings: list[str] = []
    messages = convert_openai_records(
        _records(value["history"], warnings), fmt=FORMAT, path="history", timeline=Timeline(source.mtime)
    )
    meta: dict[str, Any] = {}
    info = value.get("info")
    if isinstance(info, dict):
        meta.update({k: info[k] for k in ("exit_status", "submission", "model_stats") if k in info})
    return finish_transcript(FORMAT, messages, warnings, source, meta, tools=_recorded_tools(value, warnings))
