"""The ``contextlab`` policy: seed 001's hook, fixing CoPaw's ways of losing context.

Exact token counts; oversized tool output cut as it enters (stage 1) and again
when it slides out of the newest ``recent_n`` (stage 2); a split that keeps a
contiguous suffix and pins the newest request; a summary checked for all its
sections, with an offline fallback only when keeping everything would overflow
the window; a last-resort re-cut of tool output so the payload fits.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from contextlab.engine.compactors.base import SummaryRequest, SummaryResult
from contextlab.engine.core.errors import CompactorFailed
from contextlab.engine.core.messages import Message
from contextlab.engine.core.trace import StepRecord, TurnTrace, flaw
from contextlab.engine.memory.pins import instruction_with_facts, keep_pins_in_summary, pin_budget
from contextlab.engine.policies.base import Policy
from contextlab.engine.policies.contextlab.flaw_notes import (
    note_estimator_flaws,
    note_split_flaws,
    note_truncation_flaws,
)
from contextlab.engine.policies.copaw import reference as copaw
from contextlab.engine.policies.copaw.shape import local_date
from contextlab.engine.stages.split import SplitPlan, SplitPreview, newest_user_index, plan_split
from contextlab.engine.stages.summary.validity import check_summary
from contextlab.engine.stages.window_fit import fit_window, shrink_messages

if TYPE_CHECKING:
    from contextlab.engine.hook import ContextManager


class ContextlabPolicy(Policy["ContextManager"]):
    name = "contextlab"
    cuts_on_ingest = True

    def turn(self, manager: ContextManager, trace: TurnTrace) -> None:
        contextlab_turn(manager, trace, manual=False, instruction=None)

    def manual(self, manager: ContextManager, trace: TurnTrace, instruction: str | None) -> None:
        contextlab_turn(manager, trace, manual=True, instruction=instruction)

    def preview(self, manager: ContextManager) -> SplitPreview:
        return preview_split(manager)


def preview_split(manager: ContextManager) -> SplitPreview:
    """Which messages a manual compaction would summarise and which it keeps."""
    plan = plan_for(manager, [manager.tokens_of(m) for m in manager.messages], manual=True,
                    reserve=manager.profile.reserve)
    return SplitPreview(
        compact_ids=[manager.messages[i].id for i in plan.compact],
        keep_ids=[manager.messages[i].id for i in plan.keep],
        pinned_ids=[manager.messages[plan.pinned].id] if plan.pinned is not None else [],
        compact_tokens=plan.compact_tokens,
        kept_tokens=plan.kept_tokens,
        reserve=plan.reserve,
        notes=plan.notes,
    )


def contextlab_turn(manager: ContextManager, trace: TurnTrace, *, manual: bool, instruction: str | None) -> None:
    p = manager.profile
    used, left, gate = manager.gate(trace)
    if gate.status == "warning":
        trace.flaws_avoided.append(flaw(
            "gate_disables_compaction",
            f"left {left:,} ≤ reserve {p.reserve:,}: CoPaw would stop compacting here; we still compact"))
    with trace.step("tool_result_compaction", manager.observer) as rec:
        manager.stage_two(rec)
        note_truncation_flaws(manager, trace, rec)
    # When the gate leaves less than the reserve, keep only what still fits
    # under the threshold (never a negative budget).
    reserve = min(p.reserve, max(left, 0)) if gate.status == "warning" else p.reserve
    with trace.step("context_check", manager.observer) as rec:
        total = manager.live_tokens
        rec.numbers = {"total": total, "threshold_left": left, "reserve": p.reserve,
                       "estimate_total": manager.live_estimate_tokens, "exact_total": manager.live_exact_tokens}
        note_estimator_flaws(manager, trace, left)
        plan: SplitPlan | None = None
        deferred = False
        if manager.planned is None and not manual and total < left:
            rec.outcome = f"{total:,} < {left:,}: keep everything"
            rec.status = "ok"
        else:
            tokens = [manager.tokens_of(m) for m in manager.messages]
            # A staged compaction applies the split it was planned with (rebased over appends).
            plan = (manager.forced_split(tokens, trace, rec) if manager.planned is not None
                    else plan_for(manager, tokens, manual=manual, reserve=reserve))
            waits = None
            if manager.planned is None and not manual and plan.compact and copaw_trigger_waits(manager) is not None:
                shrunk = shrink_read_results(manager, trace)
                if shrunk:
                    rec.details["read_results_shrunk"] = shrunk
                    rec.reasons.append(
                        f"CoPaw would not compact yet and the payload was over the window: re-cut {len(shrunk)} "
                        "result(s) the model has read to the old-result limit (as CoPaw cuts them in place; "
                        "here each original stays in its file) instead of compacting")
                    plan = plan_for(manager, [manager.tokens_of(m) for m in manager.messages], manual=False,
                                    reserve=reserve)
                waits = copaw_would_wait(manager) if plan.compact else None
            if waits is not None:
                deferred = True
                _defer_like_copaw(manager, rec, plan, waits)
            elif manager.planned is None and not manual and not plan.fits_reserve:
                # The newest turn, which compaction cannot remove, is what is
                # large: shrink its tool output (stage 2) before compacting.
                shrunk = shrink_kept_part(manager, trace, plan, reserve)
                if shrunk:
                    rec.details["kept_part_shrunk"] = shrunk
                    rec.reasons.append(f"the kept part was over the {reserve:,}-token reserve: re-cut tool output "
                                       f"in {len(shrunk)} of its message(s) instead of compacting it")
                    plan = plan_for(manager, [manager.tokens_of(m) for m in manager.messages], manual=False,
                                    reserve=reserve)
            if not deferred:
                rec.status = "fired"
            rec.numbers.update(plan.as_numbers())
            rec.reasons.extend(plan.notes)
            rec.details["compact_ids"] = [manager.messages[i].id for i in plan.compact]
            rec.details["keep_ids"] = [manager.messages[i].id for i in plan.keep]
            if plan.pinned is not None:
                rec.details["pinned_id"] = manager.messages[plan.pinned].id
            if manager.pins:
                rec.details["pins"] = pins_record(manager, plan)
                rec.reasons.extend(pins_reasons(rec.details["pins"]))
            if not deferred:
                rec.outcome = (f"compact {len(plan.compact)} message(s) ({plan.compact_tokens:,} tokens), "
                               f"keep {len(plan.keep)} ({plan.kept_tokens:,} tokens)")
            if not manual and not deferred:
                note_split_flaws(manager, trace, left)
                deferred = manager.planned is None and _defer(manager, rec, plan, used)
    if deferred:
        fit_window_step(manager, trace)
        return
    if plan is None or not plan.compact:
        if plan is not None:
            trace.outcome = "nothing_to_compact"
            check = trace.get("context_check")
            if check is not None:
                reason = nothing_to_compact_reason(manager, plan)
                check.details["nothing_to_compact"] = reason
                check.reasons.append(reason)
        fit_window_step(manager, trace)
        return
    if manager.defer_summary:
        trace.outcome = "compaction_deferred"
        check = trace.get("context_check")
        if check is not None:
            check.reasons.append("another request is writing this session's summary: this turn keeps every "
                                 "message and the compaction lands when that summary does")
        fit_window_step(manager, trace)
        return
    to_compact = [manager.messages[i] for i in plan.compact]
    pinned_id = manager.messages[plan.pinned].id if plan.pinned is not None else None
    instruction = instruction_with_facts(instruction, manager.pins.facts)
    summary, result, fallback = summarise(manager, trace, to_compact, manual=manual, instruction=instruction)
    if summary is None:
        trace.outcome = "compaction_failed"
        trace.flaws_avoided.append(flaw(
            "failed_summary_drops_messages",
            f"the summary failed; CoPaw would have dropped {len(to_compact)} message(s) and the previous "
            f"summary, we kept both"))
        fit_window_step(manager, trace)
        return
    summary = manager.keep_identifiers(summary, to_compact)
    if manager.pins:
        grouped = pinned_group_ids(manager)
        summary = keep_pins_in_summary(summary, manager.pins,
                                       [manager.original(m) for m in to_compact if m.id in grouped])
    manager.mark_compressed(trace, to_compact, summary, result, fallback=fallback, trigger=trace.trigger)
    manager.pinned_ids = [pinned_id] if pinned_id else []
    if manager.pins.message_ids:
        # A pinned message that had to go is settled (the trace says so, the
        # summary holds its identifiers): the pin is not kept for a message gone.
        live = {m.id for m in manager.messages}
        manager.pins.message_ids = [mid for mid in manager.pins.message_ids if mid in live]
    trace.outcome = "fallback_summary" if fallback else "compacted"
    truncated = [m.id for m in to_compact if m.metadata.get("offload")]
    if truncated:
        trace.flaws_avoided.append(flaw(
            "archive_truncated_text",
            f"{len(truncated)} archived message(s) hold their full original tool output"))
    if any(local_date(m) != m.timestamp[:10] for m in to_compact):
        trace.flaws_avoided.append(flaw("local_time_dates", "archive files dated in UTC"))
    fit_window_step(manager, trace)


def minimum_gain(threshold: int, reserve: int, window: int, fixed: int) -> int:
    """The fewest tokens an automatic compaction must free to be worth its LLM call.

    At least the whole band between the reserve line and the threshold (and at
    least the reserve). That is the hysteresis: a compaction brings the context
    down to the reserve line, and the next one comes only once the context has
    grown by as much again, so compactions are as far apart as a first one from
    an empty context. The band does not shrink when a large summary or system
    prompt (``fixed``: system prompt, summary and tool schemas) leaves little
    room under the threshold: that is exactly when small compactions would
    follow each other.

    A compaction also waits until it would bring down a payload one reserve
    past the threshold: the fixed layers, the kept reserve and the gain add
    up to the threshold plus the reserve. Without it the first compaction (no
    summary yet, a short system prompt) fires the moment the threshold is
    crossed, sooner than CoPaw's, whose byte estimate undercounts and so
    compacts late: a band alone compacted more often than CoPaw on the long
    corpus sessions, this does not (``benchmarks/compaction_count.py``). The
    line stays two reserves below the window, so the next turn has room.
    Until a compaction is worth it the payload may sit between the threshold
    and the window, never over it.
    """
    band = max(reserve, threshold - reserve)
    return max(band, min(window - 3 * reserve, threshold) - fixed)


def copaw_trigger_waits(manager: ContextManager) -> tuple[int, int] | None:
    """``(estimate, left)`` when CoPaw's own trigger (its byte estimate of the live messages
    against the threshold less its estimate of the system prompt and summary) would not fire on
    these messages, else None. A gate at or under the reserve never fires (ReMe's assertion)."""
    p = manager.profile
    estimator = manager.estimator
    summary_msg = manager.summary_message()
    fixed = (estimator.count_message(Message.text("system", manager.system_prompt, id="_probe"))
             if manager.system_prompt else 0) + (estimator.count_message(summary_msg) if summary_msg else 0)
    left = p.threshold - fixed
    estimate = manager.live_estimate_tokens
    if left > p.reserve and estimate >= left:
        return None
    return estimate, left


def shrink_read_results(manager: ContextManager, trace: TurnTrace) -> list[dict[str, Any]]:
    """Re-cut results the model has already read, largest first, until the payload fits the window.

    What CoPaw does to a result that slides out of its recent window, without its loss: the
    original stays in ``tool_result/``. A result the model has not read yet is left whole.
    """
    window = manager.profile.max_input_length
    unread = manager.unread_result_ids()
    order = [m.id for m in sorted(manager.messages, key=manager.tokens_of, reverse=True)
             if m.tool_results and m.id not in unread]
    return shrink_messages(manager, trace, order, done=lambda: manager.payload_exact_tokens() <= window,
                           arguments=False, reason="payload over the window while CoPaw would not compact")


def copaw_would_wait(manager: ContextManager) -> tuple[int, int, int] | None:
    """CoPaw's own trigger on this payload: ``(estimate, left, payload)`` when it would not compact
    yet and the payload still fits the window, else None.

    The exact count sees dense text (records, hashes, CJK) as larger than CoPaw's byte estimate
    does, so without this an automatic compaction could come turns before CoPaw's, and the
    default policy would compact more often than the agent it replaces. Waiting for CoPaw's
    trigger costs nothing while the payload fits: nothing is lost, and the window is the bound
    that matters to the model. Once the payload would overflow the window, the exact count
    decides alone.
    """
    trigger = copaw_trigger_waits(manager)
    payload = manager.payload_exact_tokens()
    if trigger is None or payload > manager.profile.max_input_length:
        return None
    return trigger[0], trigger[1], payload


def _defer_like_copaw(manager: ContextManager, rec: StepRecord, plan: SplitPlan, waits: tuple[int, int, int]) -> None:
    estimate, left, payload = waits
    window = manager.profile.max_input_length
    rec.status = "ok"
    rec.numbers.update({"copaw_estimate": estimate, "copaw_left": left})
    rec.details["deferred_for"] = "copaw_trigger"
    reserve = manager.profile.reserve
    why = (f"CoPaw's byte estimate of the messages is {estimate:,} tokens, under the {left:,} it leaves for them"
           if left > reserve else
           f"CoPaw's gate leaves {left:,} tokens for messages, not more than the {reserve:,}-token reserve")
    rec.reasons.append(
        f"{why}: CoPaw would not compact yet, and the payload ({payload:,} tokens) fits the {window:,}-token "
        f"window, so compacting now would only make this policy compact more often: compaction deferred")
    short = f"estimate {estimate:,} < {left:,}" if left > reserve else f"its gate leaves {left:,} ≤ reserve"
    rec.outcome = (f"over the threshold, compaction deferred: CoPaw would not compact yet "
                   f"({short}) and the payload fits the window")


def _defer(manager: ContextManager, rec: StepRecord, plan: SplitPlan, fixed: int) -> bool:
    """Skip a compaction that would free too little, while the payload still fits the window."""
    if not plan.compact:
        return False
    p = manager.profile
    gain = minimum_gain(p.threshold, p.reserve, p.max_input_length, fixed)
    payload = manager.payload_exact_tokens()
    if plan.compact_tokens >= gain or payload > p.max_input_length:
        return False
    rec.status = "ok"
    rec.numbers["minimum_gain"] = gain
    rec.reasons.append(
        f"compacting would free only {plan.compact_tokens:,} tokens (less than {gain:,}) and the payload "
        f"({payload:,} tokens) fits the {p.max_input_length:,}-token window: compaction deferred")
    rec.outcome = f"over the threshold, compaction deferred: it would free only {plan.compact_tokens:,} tokens"
    return True


def shrink_kept_part(manager: ContextManager, trace: TurnTrace, plan: SplitPlan, reserve: int) -> list[dict[str, Any]]:
    """Stage 2 inside the part compaction keeps: older tool groups first, largest first.

    A result the model has not read yet (after the last assistant message) is
    cut only when it alone is larger than the reserve: no compaction could
    bring the context to the reserve line around it.
    """
    kept_ids = {manager.messages[i].id for i in plan.keep}
    unread = manager.unread_result_ids()
    newest_group_start = plan.cut
    order = [m.id for i, m in sorted(((i, manager.messages[i]) for i in plan.keep),
                                     key=lambda pair: (pair[0] >= newest_group_start, -manager.tokens_of(pair[1])))
             if (m.tool_results and (m.id not in unread or manager.tokens_of(m) > reserve)) or m.tool_uses]

    def fits() -> bool:
        return sum(manager.tokens_of(m) for m in manager.messages if m.id in kept_ids) <= reserve

    return shrink_messages(manager, trace, order, done=fits, arguments=True, reason="kept part over the reserve")


def plan_for(manager: ContextManager, tokens: list[int], *, manual: bool, reserve: int) -> SplitPlan:
    if not manual:
        return keep_pinned(manager, tokens, plan_split(manager.messages, tokens, reserve=reserve))
    # Asked for explicitly: summarise everything before the newest user turn,
    # which stays whole (CoPaw's /compact takes even that).
    newest = newest_user_index(manager.messages)
    whole_turn = keep_pinned(manager, tokens, plan_split(
        manager.messages, tokens, reserve=sum(tokens[newest:]) if newest is not None else 0))
    if whole_turn.compact:
        return whole_turn
    # One long request (an agent working through many tool rounds), or every
    # older message pinned: split inside its turn at tool-group boundaries. The
    # request stays pinned and the newest group stays; every earlier group goes.
    return keep_pinned(manager, tokens, plan_split(manager.messages, tokens, reserve=0))


def tool_groups(messages: list[Message]) -> list[list[int]]:
    """The live messages as groups that stay or go together: a call with its results, or one message."""
    caller: dict[str, int] = {}
    group_of: dict[int, list[int]] = {}
    groups: list[list[int]] = []
    for index, msg in enumerate(messages):
        owner = next((caller[r.id] for r in msg.tool_results if r.id in caller), None)
        if owner is not None:
            group_of[owner].append(index)
            group_of[index] = group_of[owner]
            continue
        group = [index]
        groups.append(group)
        group_of[index] = group
        for use in msg.tool_uses:
            caller[use.id] = index
    return groups


def pinned_groups(manager: ContextManager) -> list[list[int]]:
    pinned = set(manager.pins.message_ids)
    if not pinned:
        return []
    return [g for g in tool_groups(manager.messages) if any(manager.messages[i].id in pinned for i in g)]


def pinned_group_ids(manager: ContextManager) -> set[str]:
    return {manager.messages[i].id for g in pinned_groups(manager) for i in g}


def keep_pinned(manager: ContextManager, tokens: list[int], plan: SplitPlan) -> SplitPlan:
    """Take the pinned messages (with their tool groups) out of what ``plan`` compacts,
    newest first, while they fit the pin budget; the others go with their identifiers."""
    groups = pinned_groups(manager)
    if not groups or not plan.compact:
        return plan
    compact = set(plan.compact)
    budget = pin_budget(manager.profile.reserve)
    kept: set[int] = set()
    for group in reversed(groups):
        if not compact.intersection(group):
            continue  # already kept by the split
        cost = sum(tokens[i] for i in group)
        if cost <= budget:
            budget -= cost
            kept.update(group)
    if not kept:
        return plan
    new_compact = [i for i in plan.compact if i not in kept]
    new_keep = sorted(set(plan.keep) | kept)
    kept_tokens = sum(tokens[i] for i in new_keep)
    return dataclasses.replace(
        plan, compact=new_compact, keep=new_keep, kept_tokens=kept_tokens,
        compact_tokens=sum(tokens[i] for i in new_compact), fits_reserve=kept_tokens <= plan.reserve,
        notes=[*plan.notes, f"{len(kept)} pinned message(s) stay live"])


def pins_record(manager: ContextManager, plan: SplitPlan) -> dict[str, Any]:
    """The pins as the trace records them: which pinned messages stay, which go."""
    live = {m.id: i for i, m in enumerate(manager.messages)}
    compact = set(plan.compact)
    pinned_live = [mid for mid in manager.pins.message_ids if mid in live]
    return {"message_ids": list(manager.pins.message_ids), "facts": list(manager.pins.facts),
            "kept_live": [mid for mid in pinned_live if live[mid] not in compact],
            "compacted": [mid for mid in pinned_live if live[mid] in compact]}


def pins_reasons(record: dict[str, Any]) -> list[str]:
    reasons = []
    if record["kept_live"]:
        reasons.append(f"{len(record['kept_live'])} pinned message(s) stay live")
    if record["compacted"]:
        reasons.append(f"{len(record['compacted'])} pinned message(s) are over the pin budget: they are compacted "
                       "and their identifiers are written into the summary")
    if record["facts"]:
        reasons.append(f"{len(record['facts'])} pinned fact(s) go into the summary")
    return reasons


def nothing_to_compact_reason(manager: ContextManager, plan: SplitPlan) -> str:
    """Why a plan compacts nothing, in words a person reads on the page."""
    if not manager.messages:
        return "there is no live message to compact"
    kept = [manager.messages[i] for i in plan.keep]
    request = next((m for m in kept if m.is_user_turn), None)
    groups = sum(1 for m in kept if m.tool_uses)
    parts = []
    if request is not None:
        parts.append("the newest request, which is never compacted")
    if groups:
        parts.append("its newest tool group (a call never leaves without its results)" if request is not None
                     else "the newest tool group (a call never leaves without its results)")
    others = len(kept) - (1 if request is not None else 0) - sum(1 for m in kept if m.tool_uses or m.is_tool_result)
    if others > 0:
        parts.append(f"{others} message(s) after it")
    what = " and ".join(parts) if parts else f"{len(kept)} message(s)"
    return f"only {what} {'is' if len(kept) == 1 else 'are'} live: nothing older can be compacted"


def summarise(
    manager: ContextManager, trace: TurnTrace, to_compact: list[Message], *, manual: bool, instruction: str | None
) -> tuple[str | None, SummaryResult | None, bool]:
    """Steps 03a/03b + LLM call + validity. Returns (summary or None, result, used_fallback)."""
    p = manager.profile
    language = manager.language_for_summary(to_compact)
    originals = [manager.original(m) for m in to_compact]
    request = SummaryRequest(messages=originals, previous_summary=manager.summary, language=language,
                             extra_instruction=instruction, cap_tokens=int(p.max_input_length * 0.6))
    result: SummaryResult | None = None
    failure: str | None = None
    raw: dict[str, Any] = {}
    with trace.step("summary", manager.observer) as rec:
        rec.inputs = {"mode": "incremental" if manager.summary else "initial", "language": language,
                      "message_count": len(originals), "compactor": manager.compactor.name,
                      "instruction": instruction, "previous_summary_version": manager.summary_version}
        try:
            result = manager.compactor.summarize(request)
            rec.numbers = {"latency_ms": round(result.latency_ms, 1), "attempts": result.attempts,
                           "summary_chars": len(result.text)}
            rec.details = {"model": result.model, "usage": result.usage, "compactor": result.compactor}
            rec.outcome = f"{'incremental update' if manager.summary else 'initial summary'} by {result.compactor}"
            rec.status = "fired"
        except CompactorFailed as exc:
            failure = exc.message
            raw = {"request": getattr(exc, "raw_request", None), "response": getattr(exc, "raw_response", None)}
            rec.status = "failed"
            rec.outcome = "the summary call failed"
            rec.reasons.append(exc.message)
    with trace.step("validity", manager.observer) as rec:
        if result is not None:
            verdict = check_summary(result.text, language=language)
            rec.numbers = {"missing_sections": len(verdict.missing_sections)}
            rec.details = {"missing_sections": verdict.missing_sections}
            if verdict.valid:
                rec.outcome = "all six sections present"
                return result.text, result, False
            failure = "; ".join(verdict.reasons)
            raw = {"request": result.raw_request, "response": result.raw_response, "text": result.text}
            rec.status = "failed"
            rec.reasons.extend(verdict.reasons)
            if copaw.is_valid_summary(result.text):
                trace.flaws_avoided.append(flaw(
                    "weak_validity_check",
                    "the reply contains '##' so CoPaw would have accepted it: " + failure))
        else:
            rec.status = "skipped"
            rec.outcome = "no reply to check"
        dump = manager.save_invalid_summary(trace, failure or "unknown failure", raw)
        rec.details["saved"] = dump
        # Keep the previous summary and the messages, unless keeping them would
        # overflow the window: then an offline extractive summary stands in.
        payload_tokens = manager.payload_tokens()
        overflow = payload_tokens > p.max_input_length or manual
        if overflow and manager.compactor.name != manager.fallback_compactor.name:
            fallback = manager.fallback_compactor.summarize(request)
            rec.reasons.append(
                "fell back to the offline extractive summary" + (
                    " (manual compaction requested)" if manual else
                    f" because keeping everything would need {payload_tokens:,} of "
                    f"{p.max_input_length:,} tokens"))
            rec.outcome = "invalid or failed summary replaced by the extractive fallback"
            return fallback.text, fallback, True
        rec.outcome = "invalid or failed summary: previous summary and messages kept"
        return None, result, False



def fit_window_step(manager: ContextManager, trace: TurnTrace) -> None:
    """Last resort: if the payload would still overflow the window, shrink tool output
    and arguments in the live context (originals stay in their files)."""
    changes = fit_window(manager, trace)
    if not changes:
        return
    step = trace.get("tool_result_compaction")
    if step is not None:
        step.details["window_guard"] = [c["message_id"] for c in changes]
        step.details["window_guard_changes"] = changes
        step.reasons.append(f"re-cut {len(changes)} message(s) in the kept tail so the payload fits the window")
    trace.flaws_avoided.append(flaw(
        "newest_user_compacted",
        "the kept tail was larger than the reserve: CoPaw would have compacted everything, "
        "the newest request included; we re-cut tool output instead"))
