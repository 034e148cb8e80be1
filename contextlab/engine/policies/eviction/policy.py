"""The ``eviction`` policy: structured eviction of information units (seed 003).

Instead of summarising the whole head of the history, the context is cut into
information units, each scored by relevance, recency and density; the profile's
strategy (lowest score first, sliding window, hierarchical quota) keeps,
summarises, externalizes or drops units until the context is back under the
target. Every decision is in the turn's ``eviction`` step with its score and
reason. Nothing is lost: replaced originals go to ``externalized/`` (full
tool output included), dropped ones to the dialog archive.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from contextlab.engine.core.messages import Message
from contextlab.engine.core.tokens import REPLY_PRIMING_TOKENS
from contextlab.engine.core.trace import TurnTrace
from contextlab.engine.policies.base import Policy
from contextlab.engine.policies.contextlab.policy import contextlab_turn, preview_split
from contextlab.engine.policies.eviction import (
    ExternalStore,
    ScoreWeights,
    apply_plan,
    build_units,
    plan_eviction,
)
from contextlab.engine.stages.split import SplitPreview
from contextlab.engine.stages.window_fit import fit_window

if TYPE_CHECKING:
    from contextlab.engine.hook import ContextManager


class EvictionPolicy(Policy["ContextManager"]):
    """Automatic turns evict scored units; ``/compact`` summarises like the contextlab policy."""

    name = "eviction"

    def turn(self, manager: ContextManager, trace: TurnTrace) -> None:
        eviction_turn(manager, trace)

    def manual(self, manager: ContextManager, trace: TurnTrace, instruction: str | None) -> None:
        contextlab_turn(manager, trace, manual=True, instruction=instruction)

    def preview(self, manager: ContextManager) -> SplitPreview:
        return preview_split(manager)


def eviction_turn(manager: ContextManager, trace: TurnTrace) -> None:
    _evict(manager, trace)
    # Units are planned with exact counts, but placeholders cost tokens too
    # and the core may be larger than the window: the payload must fit anyway.
    changes = fit_window(manager, trace)
    if changes:
        step = trace.get("eviction")
        if step is not None:
            step.details["window_guard"] = changes
            step.reasons.append(f"shrank tool output or arguments in {len(changes)} message(s) so the payload "
                                "fits the window (originals in tool_result/)")


def _evict(manager: ContextManager, trace: TurnTrace) -> None:
    p = manager.profile
    used, left, _gate = manager.gate(trace)
    with trace.step("tool_result_compaction", manager.observer) as rec:
        manager.stage_two(rec)
    with trace.step("eviction", manager.observer) as rec:
        total = manager.live_tokens
        soft = max(1, p.threshold - used)
        hard = max(soft, p.max_input_length - used - REPLY_PRIMING_TOKENS)
        target = max(1, min(soft, int(p.max_input_length * p.eviction_target_ratio) - used))
        rec.inputs = {"strategy": p.eviction_strategy,
                      "weights": {"relevance": p.eviction_weight_relevance, "recency": p.eviction_weight_recency,
                                  "density": p.eviction_weight_density}}
        rec.numbers = {"total": total, "soft_limit": soft, "hard_limit": hard, "target": target,
                       "message_count": len(manager.messages)}
        if total < soft:
            rec.outcome = f"{total:,} < soft limit {soft:,}: keep everything"
            return
        messages = list(manager.messages)
        units = build_units(messages, [manager.tokens_of(m) for m in messages])
        weights = ScoreWeights(relevance=p.eviction_weight_relevance, recency=p.eviction_weight_recency,
                               density=p.eviction_weight_density)
        plan = plan_eviction(units, strategy=p.eviction_strategy, soft_limit=soft, hard_limit=hard,
                             target=target, weights=weights)
        evictions = plan.evictions()
        if not evictions:
            rec.status = "warning"
            rec.outcome = "over the soft limit, but every unit is core (the newest request and its tool round)"
            rec.reasons.extend(plan.notes)
            trace.outcome = "nothing_to_compact"
            return
        # The store and the archive receive originals (full tool output read
        # back from tool_result/), so an eviction never loses what stage 1 cut.
        whole = {mid for a in evictions if a.mode in ("round", "message") for mid in a.message_ids}
        source = [manager.original(m) if m.id in whole else m for m in messages]
        new_messages, records = apply_plan(source, plan, store=ExternalStore(manager.workspace))
        _archive_drops(manager, records, turn=trace.turn)
        archived = [mid for r in records if r["action"] == "drop" for mid in r["message_ids"]]
        externalized = {mid: r["key"] for r in records if r.get("key") for mid in r["message_ids"]}
        manager.replace_all(new_messages, archived=archived, externalized=externalized)
        for record in records:
            event: dict[str, Any] = {"event": "evicted", "turn": trace.turn, "action": record["action"],
                                     "key": record.get("key"), "reason": record["reason"],
                                     "score": record["score"]}
            if record.get("archive"):
                event["archive"] = record["archive"][0]
            for mid in record["message_ids"]:
                if mid in manager.fate:
                    manager.fate[mid].append(event)
        counts = plan.counts()
        rec.status = "fired"
        rec.numbers.update({"tokens_before": plan.tokens_before, "tokens_after": manager.live_tokens,
                            "cutoff": plan.cutoff, **{f"{k}_count": v for k, v in counts.items()}})
        rec.reasons.extend(plan.notes)
        rec.details = {"plan": plan.to_dict(), "records": [_record_view(r) for r in records]}
        rec.outcome = (f"{plan.tokens_before:,} → {manager.live_tokens:,} tokens: "
                       + ", ".join(f"{v} {k}" for k, v in counts.items() if k != "keep" and v))
        trace.outcome = "evicted"


def _archive_drops(manager: ContextManager, records: list[dict[str, Any]], *, turn: int) -> None:
    """Dropped originals go to the dialog archive (journaled like a compaction)."""
    drops = [(record, Message.from_dict(original)) for record in records if record["action"] == "drop"
             for original in record.get("originals") or []]
    if not drops:
        return
    kwargs: dict[str, Any] = {"journal_turn": turn} if manager.transactional else {}
    locations = manager.archive.append(
        [(msg, {"evicted_turn": turn, "evicted": "drop", "reason": record["reason"]}) for record, msg in drops],
        **kwargs)
    for (record, _), location in zip(drops, locations, strict=True):
        record.setdefault("archive", []).append(location.to_dict())
    manager.note_archive_files(loc.file for loc in locations)


def _record_view(record: dict[str, Any]) -> dict[str, Any]:
    """A record for the trace: without the full originals (they are on disk)."""
    return {k: v for k, v in record.items() if k != "originals"}


def placeholder_ids(messages: list[Message]) -> list[str]:
    return [m.id for m in messages if m.metadata.get("layer") == "eviction"]
