"""SWE-agent trajectories (``.traj``): ``{"history", "trajectory", "info", ...}``.

``history`` is already chat-shaped (system/user/assistant/tool). Its own keys
(``thought``, ``action``, ``agent``, ``message_type``, ``is_demo``) are kept in
``metadata["swe_agent"]``; a tool message names its call in ``tool_call_ids``
(a list), and one observation answering several calls is given to the first of
them, the others pointing back to it. ``trajectory`` (per-step environment
state) is not what the model saw and is not imported.
"""

from __future__ import annotations

from typing import Any

from contextlab.engine.importers._common import Source, Timeline, Transcript, finish_transcript
from contextlab.engine.importers.message_list import OpenAIRecord, convert_openai_records

FORMAT = "swe_agent"
_CHAT_KEYS = ("role", "content", "name", "tool_calls")


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
    return finish_transcript(FORMAT, messages, warnings, source, meta)
