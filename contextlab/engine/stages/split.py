"""Where the ``contextlab`` policy cuts the history (step 02, context_check).

Unlike CoPaw's split, the kept part is always a contiguous suffix, tool calls
and their results are never separated, earlier user/assistant turns are only
cut at their start, and the newest user message is never compacted: when the
cut has to land inside the newest turn (an agent working through many tool
calls on one request), that message is pinned and stays in the live context
right before the kept suffix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from contextlab.engine.core.messages import Message


@dataclass(frozen=True)
class SplitPlan:
    cut: int  # kept suffix = messages[cut:]
    compact: list[int]  # indices to summarise and archive, in order
    keep: list[int]  # indices that stay live, in order (pinned included)
    pinned: int | None  # index of the pinned newest user message, if any
    kept_tokens: int
    compact_tokens: int
    reserve: int
    fits_reserve: bool
    cut_kind: str  # "turn_start", "inside_newest_turn", "everything_kept", "nothing_fits"
    notes: list[str] = field(default_factory=list)

    def as_numbers(self) -> dict[str, int | bool | str | None]:
        return {
            "cut_index": self.cut,
            "compact_count": len(self.compact),
            "keep_count": len(self.keep),
            "kept_tokens": self.kept_tokens,
            "compact_tokens": self.compact_tokens,
            "reserve": self.reserve,
            "fits_reserve": self.fits_reserve,
            "cut_kind": self.cut_kind,
            "pinned_index": self.pinned,
        }


def newest_user_index(messages: Sequence[Message]) -> int | None:
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].is_user_turn:
            return index
    return None


def plan_split(messages: Sequence[Message], tokens: Sequence[int], *, reserve: int) -> SplitPlan:
    """Keep the largest allowed suffix whose tokens fit ``reserve``.

    Cost is proportional to the kept part, not to the session: the walk stops
    as soon as the accumulated tail exceeds the reserve.
    """
    n = len(messages)
    newest_user = newest_user_index(messages)
    pin_cost = tokens[newest_user] if newest_user is not None else 0

    def allowed(i: int) -> bool:
        msg = messages[i]
        if msg.role == "tool" or msg.is_tool_result:
            return False  # a result never starts the kept part: its call would be lost
        if newest_user is None or i > newest_user:
            return True  # a group start inside the newest turn
        return msg.is_user_turn  # older turns are cut only where they start

    best: int | None = None
    latest_allowed: int | None = None
    acc = 0
    for i in range(n - 1, -1, -1):
        acc += tokens[i]
        if not allowed(i):
            continue
        if latest_allowed is None:
            latest_allowed = i
        kept = acc + (pin_cost if newest_user is not None and i > newest_user else 0)
        if kept <= reserve:
            best = i
        else:
            # The kept tokens only grow as the cut moves back (the pin's cost
            # is already inside the tail once the cut passes it): stop here.
            break

    notes: list[str] = []
    if best is None:
        # Even the smallest keepable tail is over the reserve: keep it anyway
        # (compacting the request the agent is working on loses it) and let the
        # caller re-cut tool output inside it.
        cut = latest_allowed if latest_allowed is not None else n
        kind = "nothing_fits"
        notes.append("the newest tool group (with the pinned request) is larger than the reserve")
    else:
        cut = best
        kind = "turn_start" if messages[cut].is_user_turn else "inside_newest_turn"
        if cut == 0:
            kind = "everything_kept"
    pinned = newest_user if newest_user is not None and cut > newest_user else None
    compact = [i for i in range(cut) if i != pinned]
    keep = ([pinned] if pinned is not None else []) + list(range(cut, n))
    kept_tokens = sum(tokens[i] for i in keep)
    compact_tokens = sum(tokens[i] for i in compact)
    if pinned is not None:
        notes.append(f"the newest user message (index {pinned}) is pinned: the cut lands inside its turn")
    return SplitPlan(
        cut=cut,
        compact=compact,
        keep=keep,
        pinned=pinned,
        kept_tokens=kept_tokens,
        compact_tokens=compact_tokens,
        reserve=reserve,
        fits_reserve=kept_tokens <= reserve,
        cut_kind=kind,
        notes=notes,
    )


@dataclass
class SplitPreview:
    compact_ids: list[str]
    keep_ids: list[str]
    pinned_ids: list[str]
    compact_tokens: int
    kept_tokens: int
    reserve: int
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)
