"""The ``copaw`` policy: the hook as CoPaw 1.0.2 + ReMe 0.3.1.8 run it.

Every step goes through ``contextlab.engine.policies.copaw.reference`` on AgentScope-shaped
dicts, with CoPaw's byte estimator, so the numbers and decisions are the ones a
CoPaw agent saw; each way CoPaw loses context is named in the turn's
``copaw_losses``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from contextlab.engine.compactors.base import SummaryRequest, SummaryResult
from contextlab.engine.core.errors import CompactorFailed
from contextlab.engine.core.messages import Message, ToolResultBlock
from contextlab.engine.core.trace import StepRecord, TurnTrace, flaw
from contextlab.engine.policies.base import Policy
from contextlab.engine.policies.copaw import reference as copaw
from contextlab.engine.policies.copaw.shape import agentscope_output, as_agentscope, local_date
from contextlab.engine.stages.split import SplitPreview
from contextlab.engine.stages.truncation import MARKER, content_file_name

if TYPE_CHECKING:
    from contextlab.engine.hook import ContextManager


class CopawPolicy(Policy["ContextManager"]):
    """CoPaw's hook, decisions and byte estimate included (its overshoot is flagged, not fixed)."""

    name = "copaw"
    exact_counts = False

    def turn(self, manager: ContextManager, trace: TurnTrace) -> None:
        copaw_turn(manager, trace)

    def manual(self, manager: ContextManager, trace: TurnTrace, instruction: str | None) -> None:
        copaw_manual(manager, trace, instruction)

    def preview(self, manager: ContextManager) -> SplitPreview:
        return SplitPreview([m.id for m in manager.messages], [], [], manager.live_tokens, 0, 0,
                            ["CoPaw's /compact summarises every live message"])

    def summary_text(self, manager: ContextManager, summary: str) -> str:
        return copaw.wrap_summary(summary)


def copaw_turn(manager: ContextManager, trace: TurnTrace) -> None:
    p = manager.profile
    used, left, gate = manager.gate(trace)
    if left <= 0:
        gate.reasons.append("CoPaw returns here without doing anything, tool-result compaction included")
        trace.outcome = "over_budget"
        trace.copaw_losses.append(flaw("gate_disables_compaction", f"left = {left:,} ≤ 0"))
        return
    with trace.step("tool_result_compaction", manager.observer) as rec:
        copaw_tool_results(manager, trace, rec)
    with trace.step("context_check", manager.observer) as rec:
        dicts = [as_agentscope(m) for m in manager.messages]
        compact, keep, valid = copaw.check_context(dicts, threshold=left, reserve=p.reserve,
                                                   divisor=p.estimate_divisor)
        rec.numbers = {"total": manager.live_tokens, "threshold_left": left, "reserve": p.reserve,
                       "exact_total": manager.live_exact_tokens, "compact_count": len(compact),
                       "keep_count": len(keep), "is_valid": valid}
        if left <= p.reserve:
            trace.copaw_losses.append(flaw(
                "gate_disables_compaction",
                f"left {left:,} ≤ reserve {p.reserve:,}: ReMe's assertion fails and nothing is ever compacted"))
        if not compact:
            rec.outcome = "nothing to compact"
            return
        rec.status = "fired"
        if keep and keep != list(range(keep[0], len(dicts))):
            trace.copaw_losses.append(flaw("non_contiguous_keep", f"kept indices {keep[:12]}"))
        newest = max((i for i, m in enumerate(manager.messages) if m.is_user_turn), default=None)
        if not valid:
            k = copaw.copaw_fallback_keep(dicts)
            compact = list(range(0, len(dicts) - k))
            keep = list(range(len(dicts) - k, len(dicts)))
            rec.reasons.append(f"invalid split (tool ids misaligned): fallback keeps the last {k} message(s)")
            trace.copaw_losses.append(flaw("invalid_split_fallback", f"kept the last {k}, compacted {len(compact)}"))
        if newest is not None and newest in compact:
            trace.copaw_losses.append(flaw("newest_user_compacted", f"the newest user message (index {newest})"))
        rec.details = {"compact_ids": [manager.messages[i].id for i in compact],
                       "keep_ids": [manager.messages[i].id for i in keep]}
        rec.outcome = f"compact {len(compact)}, keep {len(keep)}, is_valid={valid}"
    if manager.defer_summary:
        trace.outcome = "compaction_deferred"
        rec.reasons.append("another request is writing this session's summary: this turn keeps every message")
        return
    to_compact = [manager.messages[i] for i in compact]
    copaw_compact(manager, trace, to_compact, instruction=None, trigger="auto")


def copaw_compact(manager: ContextManager, trace: TurnTrace, to_compact: list[Message], *, instruction: str | None,
                   trigger: str) -> None:
    language = manager.language_for_summary(to_compact)
    request = SummaryRequest(messages=list(to_compact), previous_summary=manager.summary, language=language,
                             extra_instruction=instruction,
                             cap_tokens=int(manager.profile.max_input_length * manager.profile.compact_ratio * 0.95))
    text = ""
    result: SummaryResult | None = None
    with trace.step("summary", manager.observer) as rec:
        rec.inputs = {"mode": "incremental" if manager.summary else "initial", "language": language,
                      "message_count": len(to_compact), "compactor": manager.compactor.name}
        try:
            result = manager.compactor.summarize(request)
            text = result.text
            rec.status = "fired"
            rec.numbers = {"latency_ms": round(result.latency_ms, 1), "attempts": result.attempts}
            rec.outcome = f"summary by {result.compactor}"
        except CompactorFailed as exc:
            rec.status = "failed"
            rec.reasons.append(exc.message)
            rec.outcome = "the summary call failed"
    with trace.step("validity", manager.observer) as rec:
        if not copaw.is_valid_summary(text):
            rec.status = "failed"
            rec.outcome = "no '##' in the reply: CoPaw treats the summary as empty"
            rec.details["saved"] = manager.save_invalid_summary(trace, "invalid summary", {"text": text})
            text = ""
        else:
            rec.outcome = "contains '##'"
    if not text and trigger == "manual":
        trace.outcome = "compaction_failed"
        return  # /compact leaves memory and summary unchanged on failure
    if not text:
        trace.outcome = "compaction_failed"
        trace.copaw_losses.append(flaw(
            "failed_summary_drops_messages",
            f"{len(to_compact)} message(s) removed and the previous summary erased"))
    if any(m.is_tool_result and MARKER in m.plain_text() for m in to_compact):
        trace.copaw_losses.append(flaw("archive_truncated_text", "archived tool output is the truncated excerpt"))
    if any(local_date(m) != m.timestamp[:10] for m in to_compact):
        trace.copaw_losses.append(flaw("local_time_dates", "archive file chosen by local time, not UTC"))
    manager.mark_compressed(trace, to_compact, text, result, fallback=False, trigger=trigger,
                          archive_originals=False, date_for=local_date)
    if text:
        trace.outcome = "compacted"
    else:
        manager.summary = None


def copaw_manual(manager: ContextManager, trace: TurnTrace, instruction: str | None) -> None:
    manager.gate(trace)
    if not manager.messages:
        trace.outcome = "nothing_to_compact"
        return
    copaw_compact(manager, trace, list(manager.messages), instruction=instruction, trigger="manual")


def copaw_tool_results(manager: ContextManager, trace: TurnTrace, rec: StepRecord) -> None:
    p = manager.profile
    dicts = [as_agentscope(m) for m in manager.messages]
    folder = manager.offload.folder
    folder.mkdir(parents=True, exist_ok=True)
    before_files = set(folder.glob("*.txt"))
    new_dicts = copaw.compact_tool_results(dicts, recent_n=p.recent_n, old_max_bytes=p.old_max_bytes,
                                           recent_max_bytes=p.recent_max_bytes, tool_result_dir=folder,
                                           file_name=content_file_name)
    removed = copaw.cleanup_expired_files(folder, p.retention_days)
    new_files = sorted(set(folder.glob("*.txt")) - before_files)
    changed: list[dict[str, Any]] = []
    silent = 0
    for index, (old, new) in enumerate(zip(dicts, new_dicts, strict=True)):
        if old == new:
            continue
        msg = manager.messages[index]
        blocks = list(msg.content)
        for b_index, block in enumerate(blocks):
            if not isinstance(block, ToolResultBlock):
                continue
            new_out = agentscope_output(new["content"], block.id)
            if new_out is None or new_out == block.output_text():
                continue
            before_bytes = len(block.output_text().encode("utf-8"))
            blocks[b_index] = ToolResultBlock(block.id, block.name, new_out, block.is_error)
            has_marker = MARKER in new_out
            silent += 0 if has_marker else 1
            changed.append({"message_id": msg.id, "tool": block.name, "bytes_before": before_bytes,
                            "bytes_after": len(new_out.encode("utf-8")), "notice": has_marker})
            manager.fate[msg.id].append({"event": "truncated", "stage": "copaw", "turn": manager.turn,
                                      "block": b_index, "bytes_before": before_bytes,
                                      "bytes_after": len(new_out.encode("utf-8"))})
        manager.replace_message(index, msg.replace_content(blocks))
    rec.details = {"changed": changed, "new_files": [f"tool_result/{f.name}" for f in new_files],
                   "expired_files_removed": removed}
    rec.numbers = {"changed": len(changed), "new_files": len(new_files), "expired_removed": removed}
    rec.status = "fired" if changed else "ok"
    rec.outcome = f"{len(changed)} result(s) cut in place" if changed else "nothing to cut"
    if changed:
        trace.copaw_losses.append(flaw("raw_byte_cut", f"{len(changed)} result(s) cut at a raw byte count"))
    if silent:
        trace.copaw_losses.append(flaw("silent_single_line_cut", f"{silent} result(s) cut with no notice"))
    if len(new_files) > len([c for c in changed if c["notice"]]) and silent:
        trace.copaw_losses.append(flaw("duplicate_remnant_file", "a remnant was saved as a new file"))
