"""The decision flow of one turn, laid out as seed 001 draws it.

``build_flow(trace)`` turns a ``contextlab.trace/1`` record into the nodes of
the seed's diagram::

    trigger → gate → 01 compact_tool_result → 02 context_check → branch
        ├─ to_compact empty → reason directly ───────────────────────────┐
        └─ 03a initial | 03b incremental → LLM call → validity → 04 ─────┴→ result

Every node says whether the turn went through it and carries its numbers, so
a non-firing turn shows as clearly as a compacting one. Steps this layout does
not know (another policy's) are kept as extra nodes, never dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

KNOWN_STEPS = ("gate", "tool_result_compaction", "context_check", "summary", "validity", "mark_compressed", "result")


@dataclass
class Link:
    label: str
    path: str  # workspace-relative file
    line: int | None = None


@dataclass
class Node:
    key: str
    label: str
    title: str
    # taken | fired | warning | failed | skipped (not on this turn's path)
    state: str = "skipped"
    outcome: str = ""
    numbers: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def on_path(self) -> bool:
        return self.state != "skipped"


@dataclass
class Flow:
    turn: int
    trigger: str
    policy: str
    outcome: str
    compacting: bool  # the branch went to step 03
    nodes: dict[str, Node]
    extra: list[Node]
    flaws_avoided: list[dict[str, str]]
    copaw_losses: list[dict[str, str]]
    error: str | None
    # Why this turn held a compaction back, when its context check deferred one ("" otherwise).
    deferred_why: str = ""

    def node(self, key: str) -> Node:
        return self.nodes[key]


def fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.1f}" if value >= 10 else f"{value:,.2f}".rstrip("0").rstrip(".")
    if value is None:
        return "–"
    return str(value)


def _num(numbers: Mapping[str, Any], *pairs: tuple[str, str]) -> list[tuple[str, str]]:
    return [(label, fmt(numbers[key])) for key, label in pairs if key in numbers and numbers[key] is not None]


def _state(step: Mapping[str, Any] | None) -> str:
    if step is None:
        return "skipped"
    status = step.get("status", "ok")
    return {"fired": "fired", "failed": "failed", "warning": "warning"}.get(status, "taken")


def build_flow(trace: Mapping[str, Any]) -> Flow:
    steps: dict[str, dict[str, Any]] = {}
    extra_steps: list[dict[str, Any]] = []
    for step in trace.get("steps") or []:
        name = step.get("step", "")
        if name in KNOWN_STEPS and name not in steps:
            steps[name] = step
        else:
            extra_steps.append(step)
    budget = trace.get("budget") or {}
    nodes: dict[str, Node] = {}

    nodes["trigger"] = Node(
        "trigger", "TRIGGER", "before the reasoning step", state="taken",
        outcome=("manual compaction requested" if trace.get("trigger") == "manual"
                 else "the agent compacted its own context: what it sent replaces the live messages"
                 if trace.get("trigger") == "agent" else "the hook runs before every LLM call"),
        numbers=[("turn", fmt(trace.get("turn"))), ("trigger", fmt(trace.get("trigger"))),
                 ("policy", fmt(trace.get("policy"))), ("counter", fmt(trace.get("counter"))),
                 ("hook time", f"{fmt(trace.get('duration_ms'))} ms")])

    gate = steps.get("gate")
    g = (gate or {}).get("numbers") or {}
    nodes["gate"] = Node(
        "gate", "GATE CHECK", "system prompt + summary vs threshold", state=_state(gate),
        outcome=(gate or {}).get("outcome", ""),
        numbers=_num(g, ("threshold", "threshold"), ("used", "used"), ("left", "left"), ("reserve", "reserve"))
        + _num(g, ("system_tokens", "system prompt"), ("summary_tokens", "summary"),
               ("messages_tokens", "messages"), ("message_count", "live messages")),
        notes=list((gate or {}).get("reasons") or []))

    tool = steps.get("tool_result_compaction")
    t = (tool or {}).get("numbers") or {}
    details = (tool or {}).get("details") or {}
    cuts = list(details.get("stage2") or details.get("changed") or [])
    tool_node = Node(
        "tool_results", "STEP 01", "compact_tool_result", state=_state(tool),
        outcome=(tool or {}).get("outcome", ""),
        numbers=_num(t, ("stage2_count", "stage-2 cuts"), ("stage1_total", "cut at stage 1 so far"),
                     ("changed", "cut in place"), ("new_files", "new files"), ("expired_removed", "expired removed")),
        notes=list((tool or {}).get("reasons") or []))
    for cut in cuts[:20]:
        tool_node.rows.append({"tool": cut.get("tool", ""), "before": cut.get("bytes_before"),
                               "after": cut.get("bytes_after"), "file": cut.get("file"),
                               "reference_only": cut.get("reference_only", False), "message_id": cut.get("message_id")})
    if len(cuts) > 20:
        tool_node.notes.append(f"… and {len(cuts) - 20} more cut(s)")
    if details.get("window_guard"):
        tool_node.numbers.append(("re-cut by the window guard", fmt(len(details["window_guard"]))))
    nodes["tool_results"] = tool_node

    check = steps.get("context_check")
    c = (check or {}).get("numbers") or {}
    check_details = (check or {}).get("details") or {}
    split = Node(
        "context_check", "STEP 02", "context_check", state=_state(check),
        outcome=(check or {}).get("outcome", ""),
        numbers=_num(c, ("total", "messages"), ("threshold_left", "left under threshold"), ("reserve", "reserve"))
        + _num(c, ("cut_index", "cut at index"), ("compact_count", "to compact"),
               ("compact_tokens", "compact tokens"), ("keep_count", "to keep"), ("kept_tokens", "kept tokens"),
               ("cut_kind", "cut kind"), ("fits_reserve", "fits the reserve"), ("pinned_index", "pinned request at"),
               ("is_valid", "split valid")),
        notes=list((check or {}).get("reasons") or []))
    if check_details.get("pinned_id"):
        split.rows.append({"pinned_id": check_details["pinned_id"]})
    nodes["context_check"] = split

    summary = steps.get("summary")
    compacting = summary is not None
    to_compact = int(c.get("compact_count") or 0)
    deferred_why = "" if compacting else deferral_of(check)
    nodes["branch"] = Node(
        "branch", "BRANCH", "to_compact empty?", state="taken" if check else "skipped",
        outcome=(f"no: {to_compact:,} message(s) to compact" if compacting
                 else f"no, but held back: {to_compact:,} message(s) could be compacted" if deferred_why
                 else "yes: nothing to compact" if check else "not reached"))
    nodes["skip"] = Node(
        "skip", "NO COMPACTION", "reason directly", state="skipped" if compacting or not check else "taken",
        outcome=(f"compaction held back (deferred): {deferred_why}" if deferred_why else
                 {"nothing_to_compact": "over the threshold, but nothing may be compacted",
                  "over_budget": "over budget before any message"}.get(
                     str(trace.get("outcome")), "everything stays in the context")))

    s_inputs = (summary or {}).get("inputs") or {}
    s_numbers = (summary or {}).get("numbers") or {}
    s_details = (summary or {}).get("details") or {}
    mode = s_inputs.get("mode")
    common = _num(s_inputs, ("message_count", "messages"), ("language", "language"))
    nodes["initial"] = Node(
        "initial", "STEP 03a", "initial summary", state="fired" if mode == "initial" else "skipped",
        outcome="no previous summary: written from scratch" if mode == "initial" else "",
        numbers=common if mode == "initial" else [])
    nodes["incremental"] = Node(
        "incremental", "STEP 03b", "incremental update", state="fired" if mode == "incremental" else "skipped",
        outcome=(f"merged into summary v{s_inputs.get('previous_summary_version')}" if mode == "incremental" else ""),
        numbers=common if mode == "incremental" else [])
    if s_inputs.get("instruction"):
        nodes["initial" if mode == "initial" else "incremental"].notes.append(
            f"instruction: {s_inputs['instruction']}")
    compactor = s_details.get("compactor") or s_inputs.get("compactor") or ""
    usage = s_details.get("usage") or {}
    llm = Node(
        "llm", "LLM CALL" if compactor != "extractive" else "COMPACTOR", compactor or "summary",
        state=_state(summary), outcome=(summary or {}).get("outcome", ""),
        numbers=([("compactor", fmt(compactor))] if compactor else [])
        + ([("model", fmt(s_details.get("model")))] if s_details.get("model") else [])
        + _num(s_numbers, ("latency_ms", "latency ms"), ("attempts", "attempts"), ("summary_chars", "summary chars"))
        + _num(usage, ("prompt_tokens", "prompt tokens"), ("completion_tokens", "completion tokens")),
        notes=list((summary or {}).get("reasons") or []))
    if compactor == "extractive":
        llm.notes.insert(0, "offline extractive compactor: no LLM was called")
    nodes["llm"] = llm

    validity = steps.get("validity")
    v_details = (validity or {}).get("details") or {}
    valid_node = Node(
        "validity", "VALIDITY CHECK", "all six sections?", state=_state(validity),
        outcome=(validity or {}).get("outcome", ""),
        numbers=_num((validity or {}).get("numbers") or {}, ("missing_sections", "missing sections")),
        notes=list((validity or {}).get("reasons") or []))
    if v_details.get("missing_sections"):
        valid_node.notes.append("missing: " + ", ".join(map(str, v_details["missing_sections"])))
    if v_details.get("saved"):
        valid_node.links.append(Link("raw request/response", str(v_details["saved"])))
    nodes["validity"] = valid_node

    mark = steps.get("mark_compressed")
    m = (mark or {}).get("numbers") or {}
    m_details = (mark or {}).get("details") or {}
    mark_node = Node(
        "mark_compressed", "STEP 04", "mark_compressed", state=_state(mark),
        outcome=(mark or {}).get("outcome", ""),
        numbers=_num(m, ("archived", "archived"), ("summary_version", "summary version"),
                     ("first_line", "first line"), ("last_line", "last line")))
    for file in m_details.get("files") or []:
        first = m.get("first_line") if len(m_details.get("files") or []) == 1 else None
        mark_node.links.append(Link(str(file), str(file), first if isinstance(first, int) else None))
    nodes["mark_compressed"] = mark_node

    result = steps.get("result")
    r = (result or {}).get("numbers") or {}
    nodes["result"] = Node(
        "result", "RESULT", "payload sent to the LLM", state=_state(result),
        outcome=(result or {}).get("outcome", ""),
        numbers=_num(r, ("total", "payload tokens"), ("system", "system prompt"), ("summary", "summary"),
                     ("messages", "messages"), ("tool_results", "tool results"), ("message_count", "messages sent"))
        + [("window", fmt(budget.get("window", r.get("window"))))])

    extra = [Node(str(step.get("step")), "STEP", str(step.get("step")), state=_state(step),
                  outcome=step.get("outcome", ""),
                  numbers=[(k, fmt(v)) for k, v in (step.get("numbers") or {}).items()
                           if not isinstance(v, dict | list)],
                  notes=list(step.get("reasons") or []))
             for step in extra_steps]
    return Flow(
        turn=int(trace.get("turn") or 0), trigger=str(trace.get("trigger", "")), policy=str(trace.get("policy", "")),
        outcome=str(trace.get("outcome", "")), compacting=compacting, nodes=nodes, extra=extra,
        flaws_avoided=list(trace.get("flaws_avoided") or []), copaw_losses=list(trace.get("copaw_losses") or []),
        error=trace.get("error"), deferred_why=deferred_why)


def deferral_of(check: Mapping[str, Any] | None) -> str:
    """Why a context check deferred the compaction it planned ("" when it did not).

    A deferral leaves the turn's outcome "no_action" (nothing was compacted); the check's own
    outcome says "… compaction deferred: <why>", and that is what the turn list and the flow show.
    """
    text = str((check or {}).get("outcome") or "")
    return text.split("deferred:", 1)[1].strip() if "deferred:" in text else ""
