"""Shrinking live tool output and tool-call arguments, losing nothing.

Two uses, both by policies that must hold the window with exact counts:

* ``shrink_messages`` cuts the tool results (and, if asked, the arguments of
  calls already made) of chosen live messages, in the order given, until a
  token goal is met. The ``contextlab`` policy uses it when the newest turn,
  which compaction cannot remove, is what is large (stage 2 inside the kept
  part instead of another compaction).
* ``fit_window`` is the last resort of every turn: while the exact payload is
  over the window, it re-cuts results to the old-result limit, then shortens
  call arguments, then replaces results by a reference to their file.

Every original stays in ``tool_result/`` (results through the ledger,
arguments through the message's ``offload_args``), so the archive and the
verifier read them back whole.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from contextlab.engine.core.messages import Block, ToolResultBlock, ToolUseBlock
from contextlab.engine.core.trace import TurnTrace

if TYPE_CHECKING:
    from contextlab.engine.hook import ContextManager

# Arguments of a call already made are shortened to about this many bytes.
ARGUMENTS_KEEP_BYTES = 1_200


def _cut_results(manager: ContextManager, index: int, *, reference: bool) -> bool:
    """Cut every result block of ``manager.messages[index]``; True when one changed."""
    p = manager.profile
    msg = manager.messages[index]
    blocks: list[Block] = list(msg.content)
    changed = False
    for b_index, block in enumerate(blocks):
        if not isinstance(block, ToolResultBlock):
            continue
        call = manager.call_of(block.id)
        tool = call.name if call else block.name
        if tool in p.exempt_tool_names:
            continue
        previous = manager.ledger.get(f"{msg.id}#{b_index}")
        limit = p.old_max_bytes
        if previous is not None and (previous["reference_only"] or (
                not reference and previous["kept_bytes"] <= limit)):
            continue  # already as short as this step makes it
        new_block, entry = manager.cut_block(msg, b_index, block, call, limit, stage=2, reference=reference)
        if entry is None:
            continue
        manager.ledger[f"{msg.id}#{b_index}"] = entry
        blocks[b_index] = new_block
        changed = True
    if changed:
        manager.replace_message(index, msg.replace_content(blocks, offload=manager.offload_meta(msg.id, len(blocks))))
    return changed


def _cut_arguments(manager: ContextManager, index: int) -> bool:
    msg = manager.messages[index]
    blocks: list[Block] = list(msg.content)
    entries: dict[str, Any] = dict(msg.metadata.get("offload_args") or {})
    changed = False
    for b_index, block in enumerate(blocks):
        if not isinstance(block, ToolUseBlock):
            continue
        new_block, entry = manager.cut_arguments(msg, b_index, block, ARGUMENTS_KEEP_BYTES)
        if entry is None:
            continue
        entries[str(b_index)] = entry
        blocks[b_index] = new_block
        changed = True
    if changed:
        manager.replace_message(index, msg.replace_content(blocks, offload_args=entries))
    return changed


def shrink_messages(manager: ContextManager, trace: TurnTrace, ids: Sequence[str], *,
                    done: Callable[[], bool], arguments: bool, reason: str) -> list[dict[str, Any]]:
    """Cut results (then arguments) of the messages ``ids``, in that order, until ``done()``."""
    changes: list[dict[str, Any]] = []
    steps: list[tuple[str, Callable[[int], bool]]] = [
        ("results", lambda i: _cut_results(manager, i, reference=False))]
    if arguments:
        steps.append(("arguments", lambda i: _cut_arguments(manager, i)))
    for what, step in steps:
        for msg_id in ids:
            if done():
                return changes
            index = next((i for i, m in enumerate(manager.messages) if m.id == msg_id), None)
            if index is None:
                continue
            before = manager.tokens_of(manager.messages[index])
            if step(index):
                after = manager.tokens_of(manager.messages[index])
                changes.append({"message_id": msg_id, "what": what, "tokens_before": before, "tokens_after": after})
                manager.fate[msg_id].append({"event": "truncated", "stage": 2, "turn": trace.turn,
                                             "what": what, "reason": reason})
    return changes


def fit_window(manager: ContextManager, trace: TurnTrace) -> list[dict[str, Any]]:
    """Shrink live tool output and arguments until the exact payload fits the window."""
    window = manager.profile.max_input_length

    def fits() -> bool:
        return manager.payload_exact_tokens() <= window

    if fits():
        return []
    largest_first = [m.id for m in sorted(manager.messages, key=manager.tokens_of, reverse=True)
                     if m.tool_results or m.tool_uses]
    changes = shrink_messages(manager, trace, largest_first, done=fits, arguments=True, reason="window guard")
    if not fits():
        # Still over: the largest results become references to their files.
        for msg_id in largest_first:
            if fits():
                break
            index = next((i for i, m in enumerate(manager.messages) if m.id == msg_id), None)
            if index is None:
                continue
            before = manager.tokens_of(manager.messages[index])
            if _cut_results(manager, index, reference=True):
                changes.append({"message_id": msg_id, "what": "reference", "tokens_before": before,
                                "tokens_after": manager.tokens_of(manager.messages[index])})
                manager.fate[msg_id].append({"event": "truncated", "stage": 2, "turn": trace.turn,
                                             "what": "reference", "reason": "window guard"})
    return changes
