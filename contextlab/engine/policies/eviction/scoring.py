"""Scoring information units (seed 003 §2.1): relevance, recency, density.

``score = wr·relevance + wt·recency + wd·density`` with the weights normalised
to sum to 1, every feature in [0, 1]:

* **relevance**: BM25 of the unit's text (a tool result also carries its
  call's description, so the output of ``pytest tests/test_login.py`` matches
  "test_login") against the query: by default the newest user request plus the
  assistant's latest stated intent. Divided by the best unit's BM25, so the
  most relevant unit scores 1.
* **recency**: ``0.5 ** (distance / half_life)``, distance = messages between
  the unit and the newest message; half-life 24 messages by default.
* **density**: information per token. Distinct words count 1, identifiers
  (snake_case, camelCase, dotted names) 2, paths and URLs 3, error lines 3,
  numbers 0.5; ``1 - exp(-4 · items / tokens)`` saturates it, and the share
  of distinct lines (digits masked, so "line 00017: compiling module_3.c"
  repeated 2,000 times counts as one line) scales it by ``0.4 + 0.6 · share``.
  A long repetitive build log lands near 0, a short error report near 1.

Default weights 0.45 / 0.35 / 0.20: relevance first (seed 003: relevance is
what decides whether a unit still matters), recency close behind (what the
agent did last is what it builds on next), density as a tie-breaker that
pushes out bulky low-information output.

Core units are scored too (the dashboard shows them) but are never evicted:
system notes, the first user request (the task anchor: seed 003's core layer
holds "the initial task description", seed 004 calls goal and constraints the
anchor against goal drift), the newest user request, and the current tool
round (everything from the last assistant message after that request on).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

from contextlab.engine.memory.retrieval import STOPWORDS, Bm25, sample, term_counts, terms
from contextlab.engine.memory.working import one_line
from contextlab.engine.policies.eviction.units import InformationUnit, Layer


@dataclass(frozen=True)
class ScoreWeights:
    relevance: float = 0.45
    recency: float = 0.35
    density: float = 0.20
    half_life: float = 24.0  # messages

    def normalised(self) -> tuple[float, float, float]:
        total = self.relevance + self.recency + self.density
        if min(self.relevance, self.recency, self.density) < 0 or total <= 0:
            raise ValueError("score weights must be non-negative and not all zero")
        return self.relevance / total, self.recency / total, self.density / total


DEFAULT_WEIGHTS = ScoreWeights()
DENSITY_STEEPNESS = 4.0

_URL = re.compile(r"https?://\S+")
_PATH = re.compile(r"(?:~|\.{1,2})?/?(?:[\w.@+-]+/)+[\w.@+-]+|\b[\w-]+\.(?:py|c|h|js|ts|go|rs|ex|exs|md|json|ya?ml|toml|txt|html|css|sh)\b")
_IDENT = re.compile(r"\b(?:[A-Za-z]+_[A-Za-z0-9_]+|[a-z]+[A-Z][A-Za-z0-9]*|[A-Z][a-z0-9]+[A-Z][A-Za-z0-9]*|[A-Za-z_]\w*\.\w+(?:\.\w+)*)\b")
_NUMBER = re.compile(r"(?<![\w.])\d{2,}(?:\.\d+)?")
_WORD = re.compile(r"[A-Za-z]{3,}|[\u3400-\u4dbf\u4e00-\u9fff]")
_ERROR = re.compile(r"\b\w*(?:Error|Exception)\b|(?i:\b(?:error|failed|failure|fatal|traceback|panic)\b)|exit code [1-9]")
_DIGITS = re.compile(r"\d+")


@lru_cache(maxsize=8192)
def information_items(text: str) -> tuple[float, float]:
    """(weighted distinct information items, share of distinct lines) of a text."""
    body = sample(text)
    urls = set(_URL.findall(body))
    rest = _URL.sub(" ", body)
    paths = set(_PATH.findall(rest))
    idents = set(_IDENT.findall(rest)) - paths
    numbers = set(_NUMBER.findall(rest))
    words = {w.lower() for w in _WORD.findall(rest)} - STOPWORDS
    lines = [line.strip() for line in body.split("\n") if line.strip()]
    error_lines = {line for line in lines if _ERROR.search(line)}
    items = len(words) + 2.0 * len(idents) + 3.0 * (len(paths) + len(urls)) + 3.0 * min(len(error_lines), 20) \
        + 0.5 * len(numbers)
    if len(lines) < 5:
        return items, 1.0
    distinct = {_DIGITS.sub("0", line) for line in lines}
    return items, len(distinct) / len(lines)


def density_of(text: str, tokens: int) -> tuple[float, float, float]:
    """(density, items per token, distinct-line share)."""
    items, share = information_items(text)
    per_token = items / max(tokens, 1)
    return (1.0 - math.exp(-DENSITY_STEEPNESS * per_token)) * (0.4 + 0.6 * share), per_token, share


def newest_request(units: Sequence[InformationUnit]) -> InformationUnit | None:
    return next((u for u in reversed(units) if u.user_turn), None)


def default_query(units: Sequence[InformationUnit]) -> str:
    """The newest user request plus the latest assistant text after it (its stated intent)."""
    request = newest_request(units)
    parts = [request.text] if request else []
    intent = next((u for u in reversed(units) if u.type == "assistant_text" and u.text.strip()
                   and (request is None or u.position > request.position)), None)
    if intent is not None:
        parts.append(intent.text)
    return "\n".join(parts)


def core_reasons(units: Sequence[InformationUnit]) -> dict[str, str]:
    """unit id -> why it is core."""
    reasons: dict[str, str] = {}
    request = newest_request(units)
    first = next((u for u in units if u.user_turn), None)
    for u in units:
        if u.type == "system_note":
            reasons[u.id] = "core: system note"
    if first is not None and first is not request:
        reasons[first.id] = "core: first user request (the task anchor)"
    if request is not None:
        reasons[request.id] = "core: newest user request"
    after = request.position if request is not None else -1
    last_assistant = max((u.position for u in units if u.position > after and u.type in ("assistant_text", "tool_call")),
                         default=None)
    if last_assistant is not None:
        current = {u.group for u in units if u.position >= last_assistant and u.group}
        for u in units:
            if u.position >= last_assistant or (u.group is not None and u.group in current):
                reasons.setdefault(u.id, "core: current tool round")
    elif request is not None:
        for u in units:
            if u.position > request.position:
                reasons.setdefault(u.id, "core: after the newest user request")
    return reasons


def score_units(
    units: Sequence[InformationUnit], *, weights: ScoreWeights = DEFAULT_WEIGHTS, query_text: str = ""
) -> list[InformationUnit]:
    """New units with ``relevance``, ``recency``, ``density``, ``score``,
    ``score_parts``, ``core`` and ``layer`` filled in. Deterministic."""
    wr, wt, wd = weights.normalised()
    query = query_text if query_text.strip() else default_query(units)
    query_terms = terms(query)
    labels = {u.id: u.label for u in units}
    docs: list[Mapping[str, int]] = []
    for u in units:
        if u.type == "tool_result" and u.parent:
            # The call says what the output is about; its words count for the result.
            counts = dict(term_counts(u.text))
            for term, n in term_counts(labels.get(u.parent, "")).items():
                counts[term] = counts.get(term, 0) + n
            docs.append(counts)
        else:
            docs.append(term_counts(u.text))
    bm25 = Bm25(docs).scores(query_terms) if units else []
    best = max(bm25, default=0.0)
    last = max((u.position for u in units), default=0)
    core = core_reasons(units)
    out: list[InformationUnit] = []
    for u, raw in zip(units, bm25, strict=True):
        relevance = raw / best if best > 0 else 0.0
        recency = 0.5 ** ((last - u.position) / weights.half_life) if weights.half_life > 0 else 1.0
        density, per_token, share = density_of(u.text, u.tokens)
        score = wr * relevance + wt * recency + wd * density
        layer: Layer = "core" if u.id in core else ("summary" if u.type in ("summary", "recollection") else "working")
        out.append(replace(
            u, relevance=relevance, recency=recency, density=density, score=score,
            score_parts={"relevance": round(relevance, 4), "recency": round(recency, 4), "density": round(density, 4),
                         "bm25": round(raw, 4), "items_per_token": round(per_token, 4),
                         "distinct_line_share": round(share, 4)},
            core=u.id in core, core_reason=core.get(u.id), layer=layer))
    return out


def describe_scores(unit: InformationUnit) -> str:
    """Why a unit scored low, in words: "old, low density, not relevant"."""
    words: list[str] = []
    if unit.recency < 0.3:
        words.append("old")
    if unit.density < 0.3:
        words.append("low density")
    if unit.relevance < 0.1:
        words.append("unrelated to the current request")
    elif unit.relevance >= 0.5:
        words.append("relevant")
    words.append(f"{one_line(unit.label, 90)} ({unit.tokens:,} tokens)")
    return ", ".join(words)
