"""OpenHands event streams (an eval ``output.jsonl`` line, or a bare event list).

Actions and observations are events, not chat messages. What the model saw is
rebuilt the way OpenHands builds its prompt: the assistant message is the raw
completion stored in each action's ``tool_call_metadata.model_response``
(several actions from one response share it, so it is taken once), each
observation answering a call becomes a tool message, a shell run shows the
model ``prefix + content + suffix``, and an error observation that answers no
call is fed back as a user message.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from contextlab.engine.convert.agentscope import normalise_timestamp
from contextlab.engine.convert.openai import parse_openai_message
from contextlab.engine.core.messages import Block, MediaBlock, Message, Role, TextBlock, ToolResultBlock
from contextlab.engine.importers._common import (
    Source,
    Timeline,
    Transcript,
    make_message,
    recorded_tools,
    repaired_transcript,
)

FORMAT = "openhands"
# Observations that are bookkeeping, not something fed to the model.
_SILENT_OBSERVATIONS = frozenset({"recall", "agent_state_changed", "null", "agent_condensation"})
_SILENT_ACTIONS = frozenset({"recall", "change_agent_state", "null", "condensation"})


def _is_event(value: Any) -> bool:
    return isinstance(value, dict) and "source" in value and ("action" in value or "observation" in value)


def _history(source: Source) -> tuple[list[Any], dict[str, Any], int] | None:
    """(events, the eval record around them, how many records the file holds)."""
    if source.kind == "json":
        value = source.value
        if isinstance(value, dict) and isinstance(value.get("history"), list):
            history = value["history"]
            if history and all(_is_event(e) for e in history[:3]):
                return history, value, 1
        if isinstance(value, list) and value and all(_is_event(e) for e in value[:3]):
            return value, {}, 1
    if source.kind == "jsonl" and source.records:
        first = source.records[0][1]
        if isinstance(first, dict) and isinstance(first.get("history"), list):
            history = first["history"]
            if history and all(_is_event(e) for e in history[:3]):
                return history, first, len(source.records)
    return None


def matches(source: Source) -> bool:
    return _history(source) is not None


def load(source: Source) -> Transcript:
    found = _history(source)
    assert found is not None
    history, record, records = found
    warnings: list[str] = []
    if records > 1:
        warnings.append(f"the file holds {records} eval records; imported the first ({record.get('instance_id')})")
    skipped: Counter[str] = Counter()
    timeline = Timeline(source.mtime)
    call_names: dict[str, str] = {}
    responses_seen: set[str] = set()
    messages: list[Message] = []
    system_prompt: str | None = None
    meta: dict[str, Any] = {k: record[k] for k in ("instance_id", "metrics") if k in record}

    for index, event in enumerate(history):
        if not isinstance(event, dict):
            warnings.append(f"history[{index}] is not an object; skipped")
            continue
        stamp = timeline.stamp(normalise_timestamp(event.get("timestamp")))
        event_id = str(event.get("id", f"{FORMAT}-{index}"))
        raw_args = event.get("args")
        args: dict[str, Any] = raw_args if isinstance(raw_args, dict) else {}
        tcm = event.get("tool_call_metadata")
        action = event.get("action")
        observation = event.get("observation")
        if (action is not None and not isinstance(action, str)) or (
            observation is not None and not isinstance(observation, str)
        ):
            warnings.append(f"history[{index}]: action/observation is not a name; skipped")
            continue

        if action == "system":
            system_prompt = str(args.get("content") or event.get("message") or "")
            for key in ("tools", "openhands_version", "agent_class"):
                if key in args:
                    meta[key] = args[key]
            meta["system_source_index"] = index
            continue

        if action is not None:
            if isinstance(tcm, dict) and isinstance(tcm.get("model_response"), dict):
                response = tcm["model_response"]
                response_id = str(response.get("id") or event_id)
                if response_id in responses_seen:
                    continue  # one response, several tool calls: already rebuilt
                responses_seen.add(response_id)
                choices = response.get("choices")
                first = choices[0] if isinstance(choices, list) and choices else None
                choice = first.get("message") if isinstance(first, dict) else None
                if isinstance(choice, dict):
                    rebuilt = parse_openai_message(dict(choice, role="assistant"), index, call_names)
                    messages.append(
                        make_message(
                            "assistant",
                            rebuilt.content,
                            msg_id=event_id,
                            fmt=FORMAT,
                            index=index,
                            timestamp=stamp,
                            action=action,
                            model=response.get("model"),
                            usage=response.get("usage"),
                            response_id=response.get("id"),
                            **rebuilt.metadata,
                        )
                    )
                    continue
                warnings.append(f"history[{index}]: model_response without a message; used the action text")
            if action in _SILENT_ACTIONS:
                skipped[f"action:{action}"] += 1
                continue
            role: Role = "user" if event.get("source") == "user" else "assistant"
            text = args.get("content") if action == "message" else None
            if not isinstance(text, str):
                text = str(args.get("thought") or event.get("message") or "")
            content: list[Block] = [TextBlock(text)] if text else []
            for url in args.get("image_urls") or []:
                if isinstance(url, str):
                    content.append(MediaBlock(kind="image", url=url))
            messages.append(
                make_message(role, content, msg_id=event_id, fmt=FORMAT, index=index, timestamp=stamp, action=action)
            )
            continue

        if observation is not None:
            text = _observation_text(event)
            if isinstance(tcm, dict) and tcm.get("tool_call_id"):
                call_id = str(tcm["tool_call_id"])
                name = str(tcm.get("function_name") or call_names.get(call_id, ""))
                result = ToolResultBlock(id=call_id, name=name, output=text, is_error=observation == "error")
                messages.append(
                    make_message(
                        "tool", [result], msg_id=event_id, fmt=FORMAT, index=index, timestamp=stamp,
                        observation=observation, cause=event.get("cause"),
                    )
                )
                continue
            if observation in _SILENT_OBSERVATIONS:
                skipped[f"observation:{observation}"] += 1
                continue
            # OpenHands hands an observation that answers no call to the model as user text.
            messages.append(
                make_message(
                    "user", [TextBlock(text)], msg_id=event_id, fmt=FORMAT, index=index, timestamp=stamp,
                    observation=observation, cause=event.get("cause"),
                )
            )
            continue
        warnings.append(f"history[{index}] is neither an action nor an observation; skipped")

    meta["skipped_records"] = dict(skipped)
    # The system event records the tool definitions sent with every completion.
    tools = recorded_tools(meta.get("tools"), "the system event's tools", warnings)
    return repaired_transcript(FORMAT, messages, warnings, source, meta, system_prompt=system_prompt, tools=tools)


def _observation_text(event: dict[str, Any]) -> str:
    content = event.get("content")
    text = content if isinstance(content, str) else str(event.get("message") or "")
    extras = event.get("extras")
    if event.get("observation") == "run" and isinstance(extras, dict):
        run_meta = extras.get("metadata")
        if isinstance(run_meta, dict):
            prefix = run_meta.get("prefix") or ""
            suffix = run_meta.get("suffix") or ""
            text = f"{prefix}{text}{suffix}"
    return text
