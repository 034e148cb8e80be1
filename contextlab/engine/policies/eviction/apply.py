"""Carrying out an eviction plan on a message list.

The result is a new list that a provider accepts (``check_sequence`` passes):

* a collapsed tool round becomes ONE assistant text message at the round's
  place: ``[summary of tool round: …]`` or ``[externalized tool round: …]``;
* a result summarized or externalized in place keeps its block id, so its call
  is still answered;
* a replaced message keeps its role; a dropped message is gone from the list.

Nothing is lost: every summarized or externalized original is written to the
``ExternalStore`` first (the placeholder names its key and how to recall it),
and every dropped original is returned in the records (and appended to the
dialog archive when one is given). Messages the plan keeps are returned as the
very same objects.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from contextlab.engine.core.messages import Block, Message, TextBlock, ToolResultBlock, ToolUseBlock
from contextlab.engine.memory.working import call_outcome, describe_call, one_line, sentences
from contextlab.engine.policies.eviction.plan import EvictionAction, EvictionPlan, summary_budget
from contextlab.engine.policies.eviction.store import ExternalStore
from contextlab.engine.policies.eviction.units import EVICTION_META, InformationUnit
from contextlab.engine.stages.archive import DialogArchive

Summarizer = Callable[[list[Message]], str]

_PATHLIKE = re.compile(r"(?:~|\.{1,2})?/?(?:[\w.@+-]+/)+[\w.@+-]+\.\w+|\b[\w-]+\.(?:py|c|h|js|ts|go|rs|ex|exs|md|json)\b")
_ERROR = re.compile(r"\b\w*(?:Error|Exception)\b[^\n]{0,80}")


def estimate_tokens(text: str) -> int:
    """A counter-free estimate: ASCII about 4 characters a token, other characters 1."""
    ascii_chars = sum(1 for ch in text if ord(ch) < 128)
    return (ascii_chars + 3) // 4 + (len(text) - ascii_chars)


def clip_to_tokens(text: str, budget: int) -> str:
    estimate = estimate_tokens(text)
    if estimate <= budget:
        return text
    keep = max(1, int(len(text) * budget / estimate) - 1)
    return text[:keep].rstrip() + "…"


def extractive_summary(messages: list[Message]) -> str:
    """An offline summary: each call with its outcome, first error and size;
    the first sentences of any text; the paths and errors it mentions."""
    results = {b.id: b for m in messages for b in m.tool_results}
    calls = {u.id for m in messages for u in m.tool_uses}
    parts: list[str] = []
    said: list[str] = []  # after the calls: in a tool round what was done matters most
    found: list[str] = []
    for msg in messages:
        text = "\n".join(b.text for b in msg.content if isinstance(b, TextBlock))
        if text.strip():
            said.append(f"{msg.role} said: " + " ".join(sentences(text)[:2]))
            found.extend(_PATHLIKE.findall(text))
        for use in msg.tool_uses:
            result = results.get(use.id)
            outcome = call_outcome(use, result)
            status = "no result" if outcome.ok is None else ("ok" if outcome.ok else f"failed: {outcome.error}")
            size = ""
            if result is not None:
                output = result.output_text()
                size = f", {output.count(chr(10)) + 1:,} lines"
                first = next((line.strip() for line in output.split("\n") if line.strip()), "")
                if first and outcome.ok:
                    size += f", starts {one_line(first, 80)!r}"
                found.extend(_PATHLIKE.findall(output[:20_000]))
                found.extend(m.group(0) for m in _ERROR.finditer(output[:20_000]))
            parts.append(f"{use.name} {describe_call(use)!r} → {status}{size}")
        for res in msg.tool_results:
            if res.id not in calls:  # a result whose call is not in this slice
                outcome = call_outcome(None, res)
                parts.append(f"result of {res.name}: {'ok' if outcome.ok else f'failed: {outcome.error}'}; "
                             f"{one_line(res.output_text(), 120)}")
    parts.extend(said)
    names = list(dict.fromkeys(one_line(f, 80) for f in found))[:6]
    if names:
        parts.append("mentions " + ", ".join(names))
    return "; ".join(parts)


def _recall_hint(key: str) -> str:
    return f"stored as {ExternalStore.relative(key)}; call recall(\"{key}\") to restore"


def _only(msg: Message, keep: Block) -> Message:
    """A copy of ``msg`` holding one block (what a summarizer gets for one result or call)."""
    return Message(role=msg.role, content=(keep,), id=msg.id, name=msg.name, timestamp=msg.timestamp)


def _round_digest(originals: Sequence[Message]) -> str:
    results = {b.id: b for m in originals for b in m.tool_results}
    uses = [u for m in originals for u in m.tool_uses]
    items: list[str] = []
    for use in uses[:4]:
        outcome = call_outcome(use, results.get(use.id))
        status = "no result" if outcome.ok is None else ("ok" if outcome.ok else f"failed ({one_line(outcome.error or '', 90)})")
        items.append(f'{use.name} "{one_line(describe_call(use), 70)}" → {status}')
    if len(uses) > 4:
        items.append(f"and {len(uses) - 4} more call(s)")
    return "; ".join(items) or "no calls"


def _unit_stub(action: EvictionAction) -> InformationUnit:
    return InformationUnit(id=action.unit_id, type=action.unit_type or "assistant_text",  # type: ignore[arg-type]
                           message_ids=action.message_ids, tokens=action.tokens, timestamp="", position=0,
                           label=action.label)


def apply_plan(
    messages: Sequence[Message],
    plan: EvictionPlan,
    *,
    store: ExternalStore,
    summarizer: Summarizer = extractive_summary,
    archive: DialogArchive | None = None,
) -> tuple[list[Message], list[dict[str, Any]]]:
    """The evicted message list and one record per eviction (see the module docstring)."""
    by_id = {m.id: m for m in messages}
    missing = sorted({mid for a in plan.evictions() for mid in a.message_ids} - by_id.keys())
    if missing:
        raise ValueError(f"the plan names message(s) not in the list: {', '.join(missing[:5])}")
    acts_by_message: dict[str, list[EvictionAction]] = {}
    rounds: dict[str, list[EvictionAction]] = {}
    for a in plan.evictions():
        if a.mode == "round":
            rounds.setdefault(a.group or a.unit_id, []).append(a)
            for mid in a.message_ids:
                acts_by_message.setdefault(mid, []).append(a)
        else:
            acts_by_message.setdefault(a.message_ids[0], []).append(a)
    calls: dict[str, tuple[Message, ToolUseBlock]] = {}
    for other in messages:
        for use in other.tool_uses:
            calls.setdefault(use.id, (other, use))
    out: list[Message] = []
    records: list[dict[str, Any]] = []
    done_rounds: set[str] = set()
    dropped: list[tuple[Message, dict[str, Any]]] = []
    for msg in messages:
        acts = acts_by_message.get(msg.id)
        if not acts:
            out.append(msg)
            continue
        round_acts = [a for a in acts if a.mode == "round"]
        if round_acts:
            gid = round_acts[0].group or round_acts[0].unit_id
            if gid not in done_rounds:
                done_rounds.add(gid)
                placeholder, record = _collapse(rounds[gid], by_id, store, summarizer)
                records.append(record)
                if placeholder is not None:
                    out.append(placeholder)
                else:
                    dropped.extend((by_id[mid], {"evicted": "drop", "reason": record["reason"]})
                                   for mid in record["message_ids"])
            continue
        whole = [a for a in acts if a.mode == "message"]
        if whole:
            placeholder, record = _replace_message(msg, whole[0], store, summarizer)
            records.append(record)
            if placeholder is not None:
                out.append(placeholder)
            else:
                dropped.append((msg, {"evicted": "drop", "reason": record["reason"]}))
            continue
        new_msg, new_records = _in_place(msg, [a for a in acts if a.mode == "in_place"], calls, store, summarizer)
        out.append(new_msg)
        records.extend(new_records)
    if archive is not None and dropped:
        locations = archive.append(dropped)
        where = {m.id: loc.to_dict() for (m, _), loc in zip(dropped, locations, strict=True)}
        for record in records:
            if record["action"] == "drop":
                record["archive"] = [where[mid] for mid in record["message_ids"] if mid in where]
    return out, records


def _record(actions: Sequence[EvictionAction], message_ids: Sequence[str], **extra: Any) -> dict[str, Any]:
    head = actions[0]
    return {"action": head.action, "mode": head.mode, "unit_ids": [a.unit_id for a in actions],
            "message_ids": list(message_ids), "tokens": sum(a.tokens for a in actions),
            "score": round(min(a.score for a in actions), 4), "reason": head.reason, **extra}


def _placeholder(role: str, text: str, *, key: str, template: Message, meta: dict[str, Any]) -> Message:
    return Message(role=role if role in ("user", "assistant") else "user",  # type: ignore[arg-type]
                   content=(TextBlock(text),), id=f"evicted-{key}", timestamp=template.timestamp,
                   metadata={"layer": "eviction", EVICTION_META: {"key": key, **meta}})


def _collapse(actions: list[EvictionAction], by_id: dict[str, Message], store: ExternalStore,
              summarizer: Summarizer) -> tuple[Message | None, dict[str, Any]]:
    head = actions[0]
    originals = [by_id[mid] for mid in head.message_ids]
    tokens = sum(a.tokens for a in actions)
    if head.action == "drop":
        return None, _record(actions, head.message_ids, key=None, placeholder_id=None,
                             originals=[m.to_dict() for m in originals])
    key = store.put([_unit_stub(a) for a in actions], originals)
    if head.action == "externalize":
        text = f"[externalized tool round ({tokens:,} tokens): {_round_digest(originals)}; {_recall_hint(key)}]"
        summary = None
    else:
        summary = clip_to_tokens(summarizer(originals), summary_budget(tokens))
        text = f"[summary of tool round ({tokens:,} tokens): {summary}. Original {_recall_hint(key)}]"
    meta = {"action": head.action, "mode": "round", "message_ids": list(head.message_ids),
            "unit_ids": [a.unit_id for a in actions]}
    placeholder = _placeholder("assistant", text, key=key, template=originals[0], meta=meta)
    return placeholder, _record(actions, head.message_ids, key=key, placeholder_id=placeholder.id, summary=summary)


def _replace_message(msg: Message, action: EvictionAction, store: ExternalStore,
                     summarizer: Summarizer) -> tuple[Message | None, dict[str, Any]]:
    if action.action == "drop":
        return None, _record([action], [msg.id], key=None, placeholder_id=None, originals=[msg.to_dict()])
    key = store.put(_unit_stub(action), [msg])
    label = one_line(action.label or action.unit_type, 90)
    if action.action == "externalize":
        text = f"[externalized: {label} ({action.tokens:,} tokens) {_recall_hint(key)}]"
        summary = None
    else:
        summary = clip_to_tokens(summarizer([msg]), summary_budget(action.tokens))
        text = f"[summary of {label} ({action.tokens:,} tokens): {summary}. Original {_recall_hint(key)}]"
    meta = {"action": action.action, "mode": "message", "message_ids": [msg.id], "unit_ids": [action.unit_id]}
    placeholder = _placeholder(msg.role, text, key=key, template=msg, meta=meta)
    return placeholder, _record([action], [msg.id], key=key, placeholder_id=placeholder.id, summary=summary)


def _in_place(msg: Message, actions: list[EvictionAction], calls: dict[str, tuple[Message, ToolUseBlock]],
              store: ExternalStore, summarizer: Summarizer) -> tuple[Message, list[dict[str, Any]]]:
    blocks = list(msg.content)
    records: list[dict[str, Any]] = []
    block_meta: dict[str, Any] = dict((msg.metadata.get(EVICTION_META) or {}).get("blocks") or {})
    for action in actions:
        index = action.block if action.block is not None else next(
            i for i, b in enumerate(blocks) if isinstance(b, ToolResultBlock))
        block = blocks[index]
        if not isinstance(block, ToolResultBlock):
            raise ValueError(f"unit {action.unit_id} is not a tool result")
        key = store.put(_unit_stub(action), [msg])
        label = one_line(action.label or f"tool_result of {block.name}", 90)
        call = calls.get(block.id)
        outcome = call_outcome(call[1] if call else None, block)
        status = "" if outcome.ok is None else ("ok" if outcome.ok else f"failed: {one_line(outcome.error or '', 90)}")
        if action.action == "externalize":
            text = f"[externalized: {label} ({action.tokens:,} tokens, {status}) {_recall_hint(key)}]"
            summary = None
        else:
            context = [_only(call[0], call[1]), _only(msg, block)] if call else [_only(msg, block)]
            summary = clip_to_tokens(summarizer(context), summary_budget(action.tokens))
            text = f"[summary of {label} ({action.tokens:,} tokens, {status}): {summary}. Original {_recall_hint(key)}]"
        blocks[index] = ToolResultBlock(id=block.id, name=block.name, output=text, is_error=block.is_error)
        block_meta[str(index)] = {"action": action.action, "key": key, "unit_id": action.unit_id}
        records.append(_record([action], [msg.id], key=key, placeholder_id=msg.id, summary=summary))
    previous = dict(msg.metadata.get(EVICTION_META) or {})
    return msg.replace_content(blocks, **{EVICTION_META: {**previous, "blocks": block_meta}}), records
