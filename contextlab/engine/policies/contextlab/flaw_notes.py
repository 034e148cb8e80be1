"""What CoPaw would have done wrong at this turn (``contextlab`` policy).

The ``contextlab`` policy names, in each turn's ``flaws_avoided``, every known
CoPaw failure it avoided there, computed by running CoPaw's own estimator and
split on the same messages. That is how the dashboard can say "CoPaw would have
dropped 41 messages here".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from contextlab.engine.core.trace import StepRecord, TurnTrace, flaw
from contextlab.engine.policies.copaw import reference as copaw
from contextlab.engine.policies.copaw.shape import as_agentscope

if TYPE_CHECKING:
    from contextlab.engine.hook import ContextManager


def note_truncation_flaws(manager: ContextManager, trace: TurnTrace, rec: StepRecord) -> None:
    fresh = [e for e in manager.ledger.values() if e["at_turn"] == manager.turn and not e["reference_only"]]
    if fresh:
        trace.flaws_avoided.append(flaw(
            "raw_byte_cut",
            f"{len(fresh)} result(s) cut at a line or character boundary with the true byte count"))
    single_line = [e for e in fresh if e["single_line"]]
    if single_line:
        trace.flaws_avoided.append(flaw(
            "silent_single_line_cut",
            f"{len(single_line)} single-line result(s) got a notice with the byte offset to continue from"))

def note_estimator_flaws(manager: ContextManager, trace: TurnTrace, left: int) -> None:
    exact, estimate = manager.live_exact_tokens, manager.live_estimate_tokens
    if exact >= left > estimate:
        trace.flaws_avoided.append(flaw(
            "estimator_undercount",
            f"exact {exact:,} tokens ≥ {left:,} but CoPaw's estimate is {estimate:,}: it would not compact yet"))
    elif estimate >= left > exact:
        trace.flaws_avoided.append(flaw(
            "estimator_overcount",
            f"CoPaw's estimate {estimate:,} ≥ {left:,} while the exact count is {exact:,}"))

def note_split_flaws(manager: ContextManager, trace: TurnTrace, left: int) -> None:
    """Run CoPaw's own split on the same messages and name what it would get wrong."""
    dicts = [as_agentscope(m) for m in manager.messages]
    reserve = manager.profile.reserve
    compact, keep, valid = copaw.check_context(dicts, threshold=max(left, 0), reserve=reserve,
                                               divisor=manager.profile.estimate_divisor)
    if not compact and not valid and left <= reserve:
        return  # already named at the gate
    if keep and keep != list(range(keep[0], len(dicts))):
        trace.flaws_avoided.append(flaw("non_contiguous_keep", f"CoPaw would keep indices {keep[:8]}…"))
    if not valid:
        k = copaw.copaw_fallback_keep(dicts)
        trace.flaws_avoided.append(flaw(
            "invalid_split_fallback",
            f"CoPaw's split is invalid; it would keep the last {k} message(s) and compact {len(dicts) - k}"))
    newest = max((i for i, m in enumerate(manager.messages) if m.is_user_turn), default=None)
    if newest is not None and newest in compact:
        trace.flaws_avoided.append(flaw("newest_user_compacted",
                                        f"CoPaw would compact the newest user message (index {newest})"))
    kept_set = set(keep)
    for i in keep:
        if manager.messages[i].role == "assistant" and i > 0 and (i - 1) not in kept_set and \
                manager.messages[i - 1].is_user_turn:
            trace.flaws_avoided.append(flaw("turn_split", f"CoPaw keeps answer {i} without question {i - 1}"))
            break
