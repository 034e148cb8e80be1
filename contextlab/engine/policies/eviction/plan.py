"""Eviction planning: which unit stays, and how each other one leaves.

Pure and deterministic: the plan is computed from scored units and limits
only; ``apply.apply_plan`` carries it out.

Limits. Above ``soft_limit`` tokens a plan evicts down to ``target``; after
the plan the context must be under ``hard_limit`` (``target ≤ soft ≤ hard``).
A context at or under the soft limit is left alone.

Actions. ``keep``; ``summarize`` (replaced by a short self-contained summary
that names where the original is stored); ``externalize`` (replaced by a
placeholder naming what was stored, where, and how to get it back); ``drop``
(removed from the context; ``apply_plan`` returns the original in its
records and can append it to the dialog archive, so nothing is lost).

Where an action lands (``mode``):

* ``message``: a message outside any tool round (a request, an answer, an
  older summary) is replaced or removed whole.
* ``in_place``: a tool result is summarized or externalized inside its own
  message, so its call keeps its answer: a provider rejects a call without a
  result (the dependency rule: a kept call never loses its results silently).
* ``round``: a whole tool round (the assistant message with the calls and the
  messages with their results) becomes ONE assistant text message, or goes.
  A call is never removed while a result of it stays, and a result never
  stays without its call.

Which action a unit gets depends on its size and kind, not on the strategy
(except that ``hierarchical_quota`` prefers summaries): below
``DROP_BELOW_TOKENS`` a placeholder would cost about as much as the text, so
the unit is dropped; tool output of ``EXTERNALIZE_FROM_TOKENS`` or more is
externalized (a summary cannot hold a log; the raw output must come back
verbatim when asked for); prose is summarized.

Strategies (seed 003 §3.2):

* ``lowest_score_first``: evict the lowest-scored candidates until the target
  is met. Candidates are results (in place), whole rounds (scored by their best
  unit, so a round only goes when every part of it is weak) and messages.
* ``sliding_window``: evict the oldest candidates first, whatever their
  score; rounds leave whole. What is left is the newest window plus the core.
* ``hierarchical_quota``: three layers with quotas as shares of the target:
  core 0.2 (never evicted; when larger, it eats into the working share, and
  the plan says so), working 0.6, summary 0.2. Existing summaries and
  recollections over the summary quota are compressed first (lowest score
  first); then working units are summarized, lowest score first, and their
  summaries join the summary layer; if that pushes the summary layer over its
  quota, its oldest entries are dropped (their originals stay stored).
  Unused core or summary share flows to the working layer.

Every strategy ends with the same safety net: above the hard limit, non-core
candidates are dropped lowest score first; if the core alone is still over it,
the largest core tool results are summarized in place (the requests and
system notes never are). A plan that still cannot meet the hard limit says so
(``fits_hard_limit`` False) instead of breaking the core.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from contextlab.engine.memory.working import one_line
from contextlab.engine.policies.eviction.scoring import (
    DEFAULT_WEIGHTS,
    ScoreWeights,
    describe_scores,
    score_units,
)
from contextlab.engine.policies.eviction.units import InformationUnit


class EvictionStrategy(StrEnum):
    LOWEST_SCORE_FIRST = "lowest_score_first"
    SLIDING_WINDOW = "sliding_window"
    HIERARCHICAL_QUOTA = "hierarchical_quota"


Action = Literal["keep", "summarize", "externalize", "drop"]
Mode = Literal["message", "in_place", "round"]
ACTIONS: tuple[str, ...] = ("keep", "summarize", "externalize", "drop")

DROP_BELOW_TOKENS = 100
EXTERNALIZE_FROM_TOKENS = 400
MIN_SAVING_TOKENS = 24
# What a replacement costs, as estimated before it exists (apply_plan clips
# summaries to ``summary_budget`` so the estimate holds).
PLACEHOLDER_TOKENS = 90
ROUND_PLACEHOLDER_BASE = 50
ROUND_PLACEHOLDER_PER_CALL = 40
ROUND_CALLS_LISTED = 4
SUMMARY_WRAPPER_TOKENS = 50


def summary_budget(tokens: int) -> int:
    """Tokens a summary of a ``tokens``-token unit may take: a fifth, within [40, 160]."""
    return max(40, min(160, tokens // 5))


@dataclass(frozen=True)
class LayerQuotas:
    core: float = 0.2
    working: float = 0.6
    summary: float = 0.2

    def __post_init__(self) -> None:
        shares = (self.core, self.working, self.summary)
        if min(shares) < 0 or abs(sum(shares) - 1.0) > 1e-6:
            raise ValueError(f"layer quotas must be non-negative shares summing to 1, got {shares}")


DEFAULT_QUOTAS = LayerQuotas()


@dataclass(frozen=True)
class EvictionAction:
    unit_id: str
    message_ids: tuple[str, ...]
    action: Action
    score: float
    reason: str
    unit_type: str = ""
    tokens: int = 0
    mode: Mode = "message"
    group: str | None = None
    block: int | None = None
    label: str = ""
    layer: str = "working"
    # The score's components (relevance, recency, density), for the trace.
    score_parts: tuple[tuple[str, float], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"unit_id": self.unit_id, "message_ids": list(self.message_ids), "action": self.action,
                "score": round(self.score, 4), "reason": self.reason, "unit_type": self.unit_type,
                "tokens": self.tokens, "mode": self.mode, "group": self.group, "block": self.block,
                "label": self.label, "layer": self.layer,
                "score_parts": {name: round(value, 4) for name, value in self.score_parts}}


@dataclass(frozen=True)
class EvictionPlan:
    strategy: str
    actions: list[EvictionAction]
    tokens_before: int
    tokens_after_estimate: int
    soft_limit: int
    hard_limit: int
    target: int
    cutoff: float | None = None
    fits_hard_limit: bool = True
    notes: list[str] = field(default_factory=list)

    def evictions(self) -> list[EvictionAction]:
        return [a for a in self.actions if a.action != "keep"]

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(ACTIONS, 0)
        for a in self.actions:
            out[a.action] += 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "tokens_before": self.tokens_before,
                "tokens_after_estimate": self.tokens_after_estimate, "soft_limit": self.soft_limit,
                "hard_limit": self.hard_limit, "target": self.target,
                "cutoff": None if self.cutoff is None else round(self.cutoff, 4),
                "fits_hard_limit": self.fits_hard_limit, "notes": self.notes, "counts": self.counts(),
                "actions": [a.to_dict() for a in self.actions]}


# -- the planner's state -----------------------------------------------------------------------------


@dataclass
class _Round:
    gid: str
    units: list[InformationUnit]
    message_ids: tuple[str, ...]
    position: int
    score: float
    tokens: int
    calls: int
    core: bool

    @property
    def results(self) -> list[InformationUnit]:
        return [u for u in self.units if u.type == "tool_result"]

    def describe(self) -> str:
        calls = [u.label for u in self.units if u.type == "tool_call"]
        shown = ", ".join(one_line(c, 60) for c in calls[:3]) + (f" and {len(calls) - 3} more" if len(calls) > 3 else "")
        return f"tool round {shown or '(no calls)'} ({self.tokens:,} tokens)"


@dataclass(frozen=True)
class _Candidate:
    kind: Literal["message", "result", "round"]
    key: str  # unit id or round id
    score: float
    position: int
    tokens: int


class _Planner:
    def __init__(self, units: Sequence[InformationUnit]) -> None:
        self.units = list(units)
        self.by_id = {u.id: u for u in self.units}
        grouped: dict[str, list[InformationUnit]] = {}
        for u in self.units:
            if u.group is not None:
                grouped.setdefault(u.group, []).append(u)
        self.rounds: dict[str, _Round] = {}
        for gid, members in grouped.items():
            self.rounds[gid] = _Round(
                gid=gid, units=members, message_ids=tuple(dict.fromkeys(m for u in members for m in u.message_ids)),
                position=min(u.position for u in members), score=max(u.score for u in members),
                tokens=sum(u.tokens for u in members), calls=sum(1 for u in members if u.type == "tool_call"),
                core=any(u.core for u in members))
        self.message_actions: dict[str, tuple[Action, str]] = {}
        self.in_place: dict[str, tuple[Action, str]] = {}
        self.collapsed: dict[str, tuple[Action, str]] = {}
        self.round_estimate = {gid: r.tokens for gid, r in self.rounds.items()}
        self.estimate = sum(u.tokens for u in self.units)
        self.notes: list[str] = []
        # Every change with the state it replaced, so the fill-back pass can undo it.
        self.log: list[tuple[str, str, Any]] = []
        self.restored: set[str] = set()

    # -- residual sizes
    @staticmethod
    def residual(action: Action, tokens: int) -> int:
        if action == "keep":
            return tokens
        if action == "drop":
            return 0
        if action == "externalize":
            return min(tokens, PLACEHOLDER_TOKENS)
        return min(tokens, summary_budget(tokens) + SUMMARY_WRAPPER_TOKENS)

    def round_residual(self, action: Action, r: _Round) -> int:
        if action == "drop":
            return 0
        if action == "externalize":
            return min(r.tokens, ROUND_PLACEHOLDER_BASE + ROUND_PLACEHOLDER_PER_CALL * min(r.calls, ROUND_CALLS_LISTED))
        return min(r.tokens, summary_budget(r.tokens) + SUMMARY_WRAPPER_TOKENS)

    # -- default actions
    @staticmethod
    def message_action(u: InformationUnit, *, prefer_summary: bool = False) -> Action:
        # Tiny texts cost less than a placeholder; recollections can be searched
        # again; an earlier placeholder or summary points to an original that is
        # already stored, and summarizing a summary gains nothing.
        if u.tokens < DROP_BELOW_TOKENS or u.type == "recollection" or u.evicted_before:
            return "drop"
        if u.type in ("tool_call", "tool_result") and not prefer_summary and u.tokens >= EXTERNALIZE_FROM_TOKENS:
            return "externalize"
        return "summarize"

    @staticmethod
    def result_action(u: InformationUnit, *, prefer_summary: bool = False) -> Action:
        return "externalize" if u.tokens >= EXTERNALIZE_FROM_TOKENS and not prefer_summary else "summarize"

    def round_action(self, r: _Round, *, prefer_summary: bool = False) -> Action:
        if r.tokens < DROP_BELOW_TOKENS:
            return "drop"
        output = sum(u.tokens for u in r.results)
        return "externalize" if output >= EXTERNALIZE_FROM_TOKENS and not prefer_summary else "summarize"

    # -- state changes; each returns the tokens saved
    def evict_message(self, u: InformationUnit, action: Action, reason: str) -> int:
        self.log.append(("message", u.id, self.message_actions.get(u.id)))
        before = self.residual(self.message_actions.get(u.id, ("keep", ""))[0], u.tokens)
        after = self.residual(action, u.tokens)
        self.message_actions[u.id] = (action, reason)
        self.estimate -= before - after
        return before - after

    def evict_result(self, u: InformationUnit, action: Action, reason: str) -> int:
        assert u.group is not None
        self.log.append(("result", u.id, self.in_place.get(u.id)))
        before = self.residual(self.in_place.get(u.id, ("keep", ""))[0], u.tokens)
        after = self.residual(action, u.tokens)
        self.in_place[u.id] = (action, reason)
        self.round_estimate[u.group] -= before - after
        self.estimate -= before - after
        return before - after

    def collapse(self, r: _Round, action: Action, reason: str) -> int:
        self.log.append(("round", r.gid, (self.collapsed.get(r.gid), self.round_estimate[r.gid])))
        before = self.round_estimate[r.gid]
        after = self.round_residual(action, r)
        self.collapsed[r.gid] = (action, reason)
        self.round_estimate[r.gid] = after
        self.estimate -= before - after
        return before - after

    def undo_cost(self, entry: tuple[str, str, Any]) -> int | None:
        """Tokens that undoing ``entry`` would add back; None when it cannot be undone alone."""
        kind, key, previous = entry
        if kind == "round":
            return int(previous[1]) - self.round_estimate[key]
        u = self.by_id[key]
        if kind == "result" and u.group in self.collapsed:
            return None  # its round left whole: the round is undone first or not at all
        current = (self.in_place if kind == "result" else self.message_actions)[key][0]
        before: Action = previous[0] if previous else "keep"
        return self.residual(before, u.tokens) - self.residual(current, u.tokens)

    def undo(self, entry: tuple[str, str, Any]) -> None:
        kind, key, previous = entry
        cost = self.undo_cost(entry)
        assert cost is not None
        self.estimate += cost
        if kind == "round":
            if previous[0] is None:
                del self.collapsed[key]
            else:
                self.collapsed[key] = previous[0]
            self.round_estimate[key] = int(previous[1])
        else:
            table = self.in_place if kind == "result" else self.message_actions
            if kind == "result":
                group = self.by_id[key].group
                assert group is not None
                self.round_estimate[group] += cost
            if previous is None:
                del table[key]
            else:
                table[key] = previous
        self.restored.add(key)

    def fill_back(self, start: int, target: int) -> None:
        """Undo evictions made since log entry ``start``, best score first, while
        the estimate stays within ``target``: evicting whole units overshoots
        the target, and giving back what still fits keeps the context fuller."""
        entries = self.log[start:]
        scored: list[tuple[float, int, tuple[str, str, Any]]] = []
        for n, entry in enumerate(entries):
            kind, key, _ = entry
            score = self.rounds[key].score if kind == "round" else self.by_id[key].score
            scored.append((score, n, entry))
        # Highest score first; among equals the latest change first (a round's
        # collapse before the in-place evictions that preceded it).
        for _, _, entry in sorted(scored, key=lambda t: (-round(t[0], 9), -t[1])):
            cost = self.undo_cost(entry)
            if cost is not None and cost > 0 and self.estimate + cost <= target and self._is_current(entry):
                self.undo(entry)

    def _is_current(self, entry: tuple[str, str, Any]) -> bool:
        """Only the latest change of a unit can be undone (earlier ones are superseded)."""
        kind, key, _ = entry
        latest = next(e for e in reversed(self.log) if e[0] == kind and e[1] == key)
        if latest is not entry:
            return False
        table = {"round": self.collapsed, "result": self.in_place, "message": self.message_actions}[kind]
        return key in table

    def saving(self, c: _Candidate, action: Action) -> int:
        if c.kind == "round":
            return self.round_estimate[c.key] - self.round_residual(action, self.rounds[c.key])
        u = self.by_id[c.key]
        current = (self.in_place if c.kind == "result" else self.message_actions).get(u.id, ("keep", ""))[0]
        return self.residual(current, u.tokens) - self.residual(action, u.tokens)

    def is_gone(self, c: _Candidate) -> bool:
        if c.kind == "round":
            return c.key in self.collapsed
        u = self.by_id[c.key]
        if c.kind == "result":
            return u.id in self.in_place or (u.group in self.collapsed)
        return u.id in self.message_actions

    # -- candidates
    def candidates(self, *, results: bool = True, layer: str | None = None) -> list[_Candidate]:
        out: list[_Candidate] = []
        for u in self.units:
            if u.group is None and not u.core and (layer is None or u.layer == layer):
                out.append(_Candidate("message", u.id, u.score, u.position, u.tokens))
        for gid, r in self.rounds.items():
            if r.core or (layer is not None and layer != "working"):
                continue
            if results:
                for u in r.results:
                    if not u.evicted_before:
                        out.append(_Candidate("result", u.id, u.score, u.position, u.tokens))
            out.append(_Candidate("round", gid, r.score, r.position, r.tokens))
        return out

    def act(self, c: _Candidate, action: Action, reason: str) -> int:
        if c.kind == "round":
            return self.collapse(self.rounds[c.key], action, reason)
        if c.kind == "result":
            return self.evict_result(self.by_id[c.key], action, reason)
        return self.evict_message(self.by_id[c.key], action, reason)

    def default_action(self, c: _Candidate, *, prefer_summary: bool = False) -> Action:
        if c.kind == "round":
            return self.round_action(self.rounds[c.key], prefer_summary=prefer_summary)
        u = self.by_id[c.key]
        if c.kind == "result":
            return self.result_action(u, prefer_summary=prefer_summary)
        return self.message_action(u, prefer_summary=prefer_summary)

    def describe(self, c: _Candidate) -> str:
        return self.rounds[c.key].describe() if c.kind == "round" else describe_scores(self.by_id[c.key])


_ORDER = {"message": 0, "result": 1, "round": 2}


def _by_score(c: _Candidate) -> tuple[float, int, int, str]:
    # At equal scores messages, then results, then rounds: a round scores as its
    # best unit, so its results (in place) must be tried before the whole round.
    return (round(c.score, 9), _ORDER[c.kind], c.position, c.key)


def _lowest_score_first(p: _Planner, target: int, *, prefer_summary: bool = False,
                        candidates: list[_Candidate] | None = None,
                        after_each: Callable[[], None] | None = None) -> float | None:
    """Evict lowest scores first until the estimate meets ``target``, then give
    back what still fits; returns the cut-off score. ``after_each`` runs after
    every eviction (the hierarchical strategy keeps its summary layer in quota)."""
    ordered = sorted(candidates if candidates is not None else p.candidates(), key=_by_score)
    start = len(p.log)
    cutoff: float | None = None
    for c in ordered:
        if p.estimate <= target:
            cutoff = c.score
            break
        if p.is_gone(c):
            continue
        action = _worthwhile(p, c, p.default_action(c, prefer_summary=prefer_summary))
        if action is not None:
            p.act(c, action, "")
            if after_each is not None:
                after_each()
    p.fill_back(start, target)
    return cutoff


def _worthwhile(p: _Planner, c: _Candidate, action: Action) -> Action | None:
    """``action`` if it saves enough; for a message, dropping it when a summary would not; else None."""
    if p.saving(c, action) >= MIN_SAVING_TOKENS:
        return action
    if c.kind == "message" and action != "drop" and p.saving(c, "drop") >= MIN_SAVING_TOKENS:
        return "drop"
    return None


def _fill_score_reasons(p: _Planner, cutoff: float | None, *, prefix: str = "") -> None:
    """Reasons for score-ordered evictions, written once the cut-off is known."""
    def reason(score: float, what: str) -> str:
        bound = f"score {score:.2f} < {cutoff:.2f} cut-off" if cutoff is not None else \
            f"score {score:.2f}, evicted with every other non-core unit"
        return f"{prefix}{bound}: {what}"

    for uid, (action, why) in list(p.message_actions.items()):
        if not why:
            u = p.by_id[uid]
            p.message_actions[uid] = (action, reason(u.score, describe_scores(u)))
    for uid, (action, why) in list(p.in_place.items()):
        if not why:
            u = p.by_id[uid]
            p.in_place[uid] = (action, reason(u.score, describe_scores(u)) + "; its call stays, so the result is "
                               + ("summarized" if action == "summarize" else "externalized") + " in place")
    for gid, (action, why) in list(p.collapsed.items()):
        if not why:
            r = p.rounds[gid]
            p.collapsed[gid] = (action, reason(r.score, r.describe()) + "; the call and its results leave together")


def _sliding_window(p: _Planner, target: int) -> int | None:
    """Evict the oldest candidates (rounds whole) until the target is met; returns the window's first position."""
    items = p.candidates(results=False)
    items.sort(key=lambda c: (c.position, c.key))
    for c in items:
        if p.estimate <= target:
            return c.position
        action = _worthwhile(p, c, p.default_action(c))
        if action is not None:
            p.act(c, action, "")
    return None


def _fill_window_reasons(p: _Planner, start: int | None, total: int) -> None:
    where = f"the window starts at message {start}" if start is not None else "no non-core message fits the window"
    for uid, (action, why) in list(p.message_actions.items()):
        if not why:
            u = p.by_id[uid]
            p.message_actions[uid] = (action, f"outside the sliding window (message {u.position} of {total}; "
                                              f"{where}): {describe_scores(u)}")
    for gid, (action, why) in list(p.collapsed.items()):
        if not why:
            r = p.rounds[gid]
            p.collapsed[gid] = (action, f"outside the sliding window (message {r.position} of {total}; {where}): "
                                        f"{r.describe()}; the call and its results leave together")


def _summary_layer_tokens(p: _Planner) -> int:
    total = 0
    for u in p.units:
        if u.layer == "summary":
            total += p.residual(p.message_actions.get(u.id, ("keep", ""))[0], u.tokens)
        elif u.layer == "working" and u.id in p.message_actions:
            total += p.residual(p.message_actions[u.id][0], u.tokens)
    for gid, (action, _) in p.collapsed.items():
        total += p.round_residual(action, p.rounds[gid])
    for uid, (action, _) in p.in_place.items():
        if p.by_id[uid].group not in p.collapsed:
            total += p.residual(action, p.by_id[uid].tokens)
    return total


def _hierarchical(p: _Planner, target: int, quotas: LayerQuotas) -> float | None:
    core_tokens = sum(u.tokens for u in p.units if u.core)
    core_quota, summary_quota = int(quotas.core * target), int(quotas.summary * target)
    p.notes.append(f"layers: core {core_tokens:,} tokens (quota {core_quota:,}), summary quota {summary_quota:,}, "
                   f"working gets the rest of the {target:,}-token target")
    if core_tokens > core_quota:
        p.notes.append(f"the core layer is {core_tokens - core_quota:,} tokens over its quota; "
                       "the excess comes out of the working layer")
    # 1. The summary layer over its quota: compress it, lowest score first.
    summaries = sorted(p.candidates(results=False, layer="summary"), key=_by_score)
    for c in summaries:
        if _summary_layer_tokens(p) <= summary_quota:
            break
        u = p.by_id[c.key]
        action: Action = "summarize" if u.tokens > 2 * (summary_budget(u.tokens) + SUMMARY_WRAPPER_TOKENS) and \
            u.type == "summary" else "drop"
        if p.saving(c, action) >= MIN_SAVING_TOKENS:
            p.act(c, action, f"summary layer over its {summary_quota:,}-token quota: "
                             f"{'shortened' if action == 'summarize' else 'dropped (still stored)'}, "
                             f"score {u.score:.2f}: {describe_scores(u)}")
    # 2. The working layer: summarize lowest scores first. The summaries join
    # the summary layer; whenever that goes over its quota, its oldest entries
    # are dropped (originals stay stored), which frees room for working units.
    def keep_summary_quota() -> None:
        _fill_score_reasons(p, None, prefix="working layer over its share; ")
        _enforce_summary_quota(p, summary_quota)

    # Giving back a working unit removes its summary too, so the quota still holds.
    cutoff = _lowest_score_first(p, target, prefer_summary=True, candidates=p.candidates(layer="working"),
                                 after_each=keep_summary_quota)
    _fill_score_reasons(p, cutoff, prefix="working layer over its share; ")
    return cutoff


def _enforce_summary_quota(p: _Planner, quota: int) -> None:
    if _summary_layer_tokens(p) <= quota:
        return
    items: list[tuple[int, str, str]] = []  # (position, kind, key); in-place summaries cannot go: their call stays
    items += [(p.by_id[uid].position, "message", uid) for uid, (a, _) in p.message_actions.items() if a != "drop"]
    items += [(p.rounds[gid].position, "round", gid) for gid, (a, _) in p.collapsed.items() if a != "drop"]
    items += [(u.position, "message", u.id) for u in p.units
              if u.layer == "summary" and u.group is None and u.id not in p.message_actions]
    for position, kind, key in sorted(items):
        if _summary_layer_tokens(p) <= quota:
            return
        note = (f"summary layer over its {quota:,}-token quota: the oldest summary (message {position}) "
                "is dropped; its original goes to the records and the archive")
        if kind == "round":
            p.collapse(p.rounds[key], "drop", note)
        else:
            p.evict_message(p.by_id[key], "drop", note)


def _hard_pass(p: _Planner, hard: int) -> None:
    if p.estimate <= hard:
        return
    p.notes.append(f"the plan was still over the {hard:,}-token hard limit: dropping non-core units, lowest score first")
    for c in sorted(p.candidates(results=False), key=_by_score):
        if p.estimate <= hard:
            return
        current = p.collapsed.get(c.key) if c.kind == "round" else p.message_actions.get(c.key)
        if current is not None and current[0] == "drop":
            continue
        what = p.describe(c)
        p.act(c, "drop", f"hard limit {hard:,}: dropped, score {c.score:.2f}: {what} (the original goes to the records and the archive)")
    if p.estimate <= hard:
        return
    core_results = sorted((u for u in p.units if u.core and u.type == "tool_result" and not u.evicted_before
                           and u.group is not None and u.group not in p.collapsed),
                          key=lambda u: (-u.tokens, u.position))
    for u in core_results:
        if p.estimate <= hard:
            return
        if u.tokens - p.residual("summarize", u.tokens) >= MIN_SAVING_TOKENS:
            p.evict_result(u, "summarize", f"hard limit {hard:,}: the core alone is over it, so this core result "
                                           f"is summarized in place ({u.tokens:,} tokens; original stored)")


def plan_eviction(
    units: Sequence[InformationUnit],
    *,
    strategy: EvictionStrategy | str,
    soft_limit: int,
    hard_limit: int,
    target: int,
    weights: ScoreWeights = DEFAULT_WEIGHTS,
    query_text: str = "",
    quotas: LayerQuotas = DEFAULT_QUOTAS,
) -> EvictionPlan:
    """Score ``units`` and plan their eviction (see the module docstring)."""
    try:
        chosen = EvictionStrategy(strategy)
    except ValueError:
        names = ", ".join(s.value for s in EvictionStrategy)
        raise ValueError(f"unknown eviction strategy {strategy!r}; expected one of {names}") from None
    if not 0 < target <= soft_limit <= hard_limit:
        raise ValueError(f"limits must satisfy 0 < target ≤ soft ≤ hard, got target={target}, "
                         f"soft={soft_limit}, hard={hard_limit}")
    scored = score_units(units, weights=weights, query_text=query_text)
    p = _Planner(scored)
    before = p.estimate
    cutoff: float | None = None
    window_start: int | None = None
    if before <= soft_limit:
        p.notes.append(f"{before:,} tokens ≤ soft limit {soft_limit:,}: nothing to evict")
    else:
        p.notes.append(f"{before:,} tokens > soft limit {soft_limit:,}: evicting down to {target:,}")
        if chosen is EvictionStrategy.LOWEST_SCORE_FIRST:
            cutoff = _lowest_score_first(p, target)
            _fill_score_reasons(p, cutoff)
        elif chosen is EvictionStrategy.SLIDING_WINDOW:
            window_start = _sliding_window(p, target)
            _fill_window_reasons(p, window_start, len({u.position for u in scored}))
        else:
            cutoff = _hierarchical(p, target, quotas)
        if p.estimate > target:
            p.notes.append(f"the target {target:,} was not reached ({p.estimate:,} tokens): "
                           "what is left is core or too small to replace")
        _hard_pass(p, hard_limit)
    fits = p.estimate <= hard_limit
    if not fits:
        p.notes.append(f"cannot meet the hard limit {hard_limit:,}: the core alone needs {p.estimate:,} tokens")
    return EvictionPlan(
        strategy=chosen.value, actions=_actions(p, before, soft_limit, cutoff, chosen), tokens_before=before,
        tokens_after_estimate=p.estimate, soft_limit=soft_limit, hard_limit=hard_limit, target=target,
        cutoff=cutoff, fits_hard_limit=fits, notes=p.notes)


def _actions(p: _Planner, before: int, soft: int, cutoff: float | None, strategy: EvictionStrategy) -> list[EvictionAction]:
    out: list[EvictionAction] = []
    answered_in_place = {p.by_id[uid].parent for uid in p.in_place}
    for u in p.units:
        common: dict[str, Any] = {"unit_type": u.type, "tokens": u.tokens, "group": u.group, "block": u.block,
                                  "label": u.label, "layer": u.layer,
                                  "score_parts": tuple(sorted((u.score_parts or {}).items()))}
        if u.group is not None and u.group in p.collapsed:
            action, reason = p.collapsed[u.group]
            out.append(EvictionAction(u.id, p.rounds[u.group].message_ids, action, u.score, reason, mode="round",
                                      **common))
        elif u.id in p.in_place:
            action, reason = p.in_place[u.id]
            out.append(EvictionAction(u.id, u.message_ids, action, u.score, reason, mode="in_place", **common))
        elif u.id in p.message_actions:
            action, reason = p.message_actions[u.id]
            out.append(EvictionAction(u.id, u.message_ids, action, u.score, reason, mode="message", **common))
        else:
            out.append(EvictionAction(u.id, u.message_ids, "keep", u.score,
                                      _keep_reason(u, before, soft, cutoff, strategy, answered_in_place,
                                                   p.restored), **common))
    return out


def _keep_reason(u: InformationUnit, before: int, soft: int, cutoff: float | None, strategy: EvictionStrategy,
                 answered_in_place: set[str | None], restored: set[str]) -> str:
    if u.core and u.core_reason:
        return u.core_reason
    if u.id in restored or (u.group is not None and u.group in restored):
        return (f"kept (score {u.score:.2f}): evicted, then given back because the context fits the target "
                "without it leaving")
    if before <= soft:
        return f"under the soft limit ({before:,} ≤ {soft:,} tokens)"
    if u.type == "tool_call" and u.id in answered_in_place:
        return "kept: its results were replaced in place, so the call keeps its answers"
    if strategy is EvictionStrategy.SLIDING_WINDOW:
        return "inside the sliding window"
    if cutoff is not None and u.score >= cutoff:
        return f"score {u.score:.2f} ≥ {cutoff:.2f} cut-off"
    return f"kept (score {u.score:.2f}): the target was met, or replacing it would save under {MIN_SAVING_TOKENS} tokens"
