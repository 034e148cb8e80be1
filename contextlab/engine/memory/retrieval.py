"""Search over everything a workspace keeps outside the live context.

Three places hold text the agent no longer sees: the dialog archive
(``dialog/*.jsonl``, one message per line), externalized units
(``externalized/<key>.json``, written by the eviction store) and offloaded
tool output (``tool_result/<uuid>.txt``). ``search_workspace`` ranks all of them
with one lexical scorer (BM25 over words and identifiers, our own
implementation, no index on disk); ``recollection_message`` turns hits into a
clearly marked user-role message the engine can inject, so the model can tell
recalled material from the live conversation.

The lexical helpers (``terms``, ``Bm25``) live here because the eviction
scorer uses the same notion of "the same word" as the search: a query that
finds a unit in the archive should also find it relevant while it is live.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from contextlab.engine.core.messages import Message, TextBlock

EXTERNALIZED_DIR = "externalized"
DIALOG_DIR = "dialog"
TOOL_RESULT_DIR = "tool_result"

# Huge outputs are sampled (head and tail) before they are tokenised: the
# terms of a 5 MB log's middle add little to its ranking and cost a lot.
SAMPLE_HEAD_CHARS = 30_000
SAMPLE_TAIL_CHARS = 10_000
# Offloaded files are searched in windows of lines, so a hit can say where.
CHUNK_LINES = 40
SNIPPET_CHARS = 240

_TERM = re.compile(
    r"[A-Za-z_][A-Za-z0-9_]*(?:[./:\-][A-Za-z0-9_]+)*"  # words, identifiers, dotted/pathy names
    r"|\d+(?:[.:]\d+)*"  # numbers, versions, times
    r"|[\u3400-\u4dbf\u4e00-\u9fff]+"  # CJK runs (split into bigrams below)
)
_PART_SPLIT = re.compile(r"[./:\-_]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")
STOPWORDS = frozenset(
    """a an and are as at be been but by can could did do does for from had has have he her his how i if in
    into is it its let me my no not of on or our she so than that the their them then there these they this
    those to too us was we were what when where which who will with would you your yes just also only very
    here now all any some each other such own same few more most both""".split()  # noqa: SIM905
)


def sample(text: str) -> str:
    """The head and tail of a long text; short texts unchanged."""
    if len(text) <= SAMPLE_HEAD_CHARS + SAMPLE_TAIL_CHARS:
        return text
    return text[:SAMPLE_HEAD_CHARS] + "\n" + text[-SAMPLE_TAIL_CHARS:]


def _expand(token: str) -> Iterable[str]:
    if _CJK.match(token):
        # Chinese has no spaces: overlapping bigrams are the usual cheap unit.
        if len(token) == 1:
            yield token
        for i in range(len(token) - 1):
            yield token[i : i + 2]
        return
    low = token.lower()
    if low[0].isdigit():
        # Single digits are everywhere (line numbers, counters): noise.
        if len(low) >= 2:
            yield low
        return
    if len(low) >= 2 and low not in STOPWORDS:
        yield low
    # An identifier also matches its parts: "src/app/models.py" is found by
    # "models", "parse_args" by "args", "TimeDelta" by "delta".
    pieces = _PART_SPLIT.split(token)
    if len(pieces) > 1 or _CAMEL.search(token):
        for piece in pieces:
            for sub in _CAMEL.split(piece):
                sub_low = sub.lower()
                if len(sub_low) >= 2 and sub_low != low and sub_low not in STOPWORDS:
                    yield sub_low


@lru_cache(maxsize=8192)
def term_counts(text: str) -> Mapping[str, int]:
    """Term frequencies of a text (cached: live messages are scored every turn).

    The result is shared between callers: read it, never modify it.
    """
    counts: Counter[str] = Counter()
    for match in _TERM.finditer(sample(text)):
        counts.update(_expand(match.group(0)))
    return counts


def terms(text: str) -> list[str]:
    """The distinct terms of a text, sorted (a query's terms)."""
    return sorted(term_counts(text))


class Bm25:
    """Okapi BM25 over a fixed set of documents (term-count mappings).

    k1 = 1.2 and b = 0.75 are the textbook defaults; the idf is the
    non-negative variant ``ln(1 + (N - df + 0.5) / (df + 0.5))`` so a term in
    every document still counts a little instead of subtracting.
    """

    def __init__(self, docs: Sequence[Mapping[str, int]], *, k1: float = 1.2, b: float = 0.75) -> None:
        self.docs = docs
        self.k1 = k1
        self.b = b
        self.lengths = [sum(d.values()) for d in docs]
        self.avg_length = (sum(self.lengths) / len(docs)) if docs else 0.0
        self.df: Counter[str] = Counter()
        for doc in docs:
            self.df.update(doc.keys())

    def idf(self, term: str) -> float:
        n = len(self.docs)
        df = self.df.get(term, 0)
        return math.log(1.0 + (n - df + 0.5) / (df + 0.5))

    def scores(self, query_terms: Iterable[str]) -> list[float]:
        # Sorted, de-duplicated query terms: float sums in a fixed order give
        # the same scores on every run.
        query = sorted(set(query_terms))
        idfs = [(t, self.idf(t)) for t in query if t in self.df]
        out: list[float] = []
        avg = self.avg_length or 1.0
        for doc, length in zip(self.docs, self.lengths, strict=True):
            total = 0.0
            norm = self.k1 * (1.0 - self.b + self.b * length / avg)
            for term, idf in idfs:
                tf = doc.get(term, 0)
                if tf:
                    total += idf * tf * (self.k1 + 1.0) / (tf + norm)
            out.append(total)
        return out


# -- search -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hit:
    """One search result.

    ``kind``: "dialog", "externalized", "tool_result" or "memory";
    ``location``: workspace-relative file plus line (``dialog/2026-03-20.jsonl:12``,
    ``tool_result/<uuid>.txt:81``) or the externalized file; ``message_id``:
    the message the text belongs to, when known.
    """

    kind: str
    location: str
    message_id: str | None
    snippet: str
    score: float

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "location": self.location, "message_id": self.message_id,
                "snippet": self.snippet, "score": round(self.score, 4)}


@dataclass(frozen=True)
class Document:
    kind: str
    location: str
    message_id: str | None
    text: str


def snippet_for(text: str, query_terms: Sequence[str], *, width: int = SNIPPET_CHARS) -> str:
    """A one-line window of ``text`` around the first query term it contains."""
    low = text.lower()
    first = -1
    for term in query_terms:
        at = low.find(term)
        if at >= 0 and (first < 0 or at < first):
            first = at
    start = max(0, first - width // 3) if first >= 0 else 0
    piece = re.sub(r"\s+", " ", text[start : start + width]).strip()
    prefix = "…" if start > 0 else ""
    suffix = "…" if start + width < len(text) else ""
    return f"{prefix}{piece}{suffix}"


def rank_documents(docs: Sequence[Document], query: str, *, limit: int = 20) -> list[Hit]:
    """BM25 over ``docs``, plus a bonus when the whole query occurs verbatim.

    People search for exact things (an id, a path, an error message): a
    verbatim occurrence doubles the score so it outranks documents that only
    share the query's words.
    """
    query_terms = terms(query)
    needle = query.strip().lower()
    if not docs or (not query_terms and not needle):
        return []
    index = Bm25([term_counts(d.text) for d in docs])
    scores = index.scores(query_terms)
    ranked: list[tuple[float, int]] = []
    for i, (doc, score) in enumerate(zip(docs, scores, strict=True)):
        if needle and needle in sample(doc.text).lower():
            score = score * 2.0 + 1.0
        if score > 0:
            ranked.append((score, i))
    ranked.sort(key=lambda pair: (-pair[0], docs[pair[1]].location, pair[1]))
    hits: list[Hit] = []
    for score, i in ranked[: max(0, limit)]:
        doc = docs[i]
        probe = [needle, *query_terms] if needle else list(query_terms)
        hits.append(Hit(doc.kind, doc.location, doc.message_id, snippet_for(doc.text, probe), score))
    return hits


def message_search_text(data: Mapping[str, Any]) -> str:
    """The searchable text of a message in its JSON form (``Message.to_dict``)."""
    parts: list[str] = []
    for block in data.get("content") or []:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            parts.append(str(block.get("text", "")))
        elif kind == "thinking":
            parts.append(str(block.get("thinking", "")))
        elif kind == "tool_use":
            parts.append(f"{block.get('name', '')} {json.dumps(block.get('input') or {}, ensure_ascii=False)}")
        elif kind == "tool_result":
            output = block.get("output")
            if isinstance(output, str):
                parts.append(output)
            elif isinstance(output, list):
                parts.extend(str(p.get("text", "")) for p in output if isinstance(p, dict))
        elif kind in ("image", "audio", "video", "file"):
            parts.append(str(block.get("url") or ""))
    return "\n".join(parts)


def _read_json_lines(path: Path) -> list[tuple[int, dict[str, Any]]]:
    out: list[tuple[int, dict[str, Any]]] = []
    with path.open(encoding="utf-8", errors="replace") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line after a crash: skip it, keep the rest
            if isinstance(data, dict):
                out.append((number, data))
    return out


def _offload_owners(records: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Offloaded file -> message id, from the offload metadata of archived messages."""
    owners: dict[str, str] = {}
    for data in records:
        meta = data.get("metadata") or {}
        for entry in (meta.get("offload") or {}).values():
            if isinstance(entry, dict) and entry.get("file"):
                owners.setdefault(str(entry["file"]), str(data.get("id")))
        for file in meta.get("offloaded_files") or []:
            owners.setdefault(str(file), str(data.get("id")))
    return owners


def workspace_documents(workspace: str | Path) -> list[Document]:
    """Every searchable piece of a workspace, in a stable order."""
    root = Path(workspace)
    docs: list[Document] = []
    seen_records: list[Mapping[str, Any]] = []
    dialog = root / DIALOG_DIR
    if dialog.is_dir():
        for path in sorted(dialog.glob("*.jsonl")):
            for number, data in _read_json_lines(path):
                seen_records.append(data)
                docs.append(Document("dialog", f"{DIALOG_DIR}/{path.name}:{number}",
                                     str(data.get("id")) if data.get("id") else None, message_search_text(data)))
    ext = root / EXTERNALIZED_DIR
    if ext.is_dir():
        for path in sorted(ext.glob("*.json")):
            try:
                stored = json.loads(path.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            for data in stored.get("messages") or []:
                if isinstance(data, dict):
                    seen_records.append(data)
                    docs.append(Document("externalized", f"{EXTERNALIZED_DIR}/{path.name}",
                                         str(data.get("id")) if data.get("id") else None,
                                         message_search_text(data)))
    owners = _offload_owners(seen_records)
    offloaded = root / TOOL_RESULT_DIR
    if offloaded.is_dir():
        for path in sorted(offloaded.glob("*.txt")):
            relative = f"{TOOL_RESULT_DIR}/{path.name}"
            lines = path.read_bytes().decode("utf-8", errors="replace").split("\n")
            for start in range(0, max(len(lines), 1), CHUNK_LINES):
                chunk = "\n".join(lines[start : start + CHUNK_LINES])
                if chunk.strip():
                    docs.append(Document("tool_result", f"{relative}:{start + 1}", owners.get(relative), chunk))
    memory_files = [root / "MEMORY.md", *sorted((root / "memory").glob("*.md"))] if root.is_dir() else []
    for path in memory_files:
        if path.is_file():
            relative = path.relative_to(root).as_posix()
            for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").split("\n"), 1):
                if line.strip().startswith(("-", "*")):
                    docs.append(Document("memory", f"{relative}:{number}", None, line.strip()))
    return docs


def search_workspace(workspace: str | Path, query: str, *, limit: int = 20) -> list[Hit]:
    """Rank the archive, externalized units, offloaded outputs and memory notes of a workspace."""
    return rank_documents(workspace_documents(workspace), query, limit=limit)


# -- recollection ----------------------------------------------------------------------------------

RECOLLECTION_NAME = "recollection"
RECOLLECTION_ITEM_CHARS = 1_200


def recollection_message(hits_or_messages: Sequence[Hit] | Sequence[Message], *, query: str) -> Message:
    """A user-role message that says plainly it is recalled material, and from where.

    Given hits, it lists their snippets with locations; given messages (e.g.
    from ``ExternalStore.get``), their text, clipped. The wrapper tells the
    model this is not a new request (seed 003: re-inject retrieved content "as
    a recollection", never as if it were part of the current dialogue).
    """
    items: list[str] = []
    sources: list[dict[str, Any]] = []
    for item in hits_or_messages:
        if isinstance(item, Hit):
            where = item.location + (f", message {item.message_id}" if item.message_id else "")
            items.append(f"- ({item.kind}, {where}) {item.snippet}")
            sources.append({"kind": item.kind, "location": item.location, "message_id": item.message_id})
        else:
            text = _message_text(item)
            if len(text) > RECOLLECTION_ITEM_CHARS:
                text = text[:RECOLLECTION_ITEM_CHARS] + f" … [{len(text) - RECOLLECTION_ITEM_CHARS:,} more characters]"
            where = item.metadata.get("location") or f"message {item.id}"
            items.append(f"- ({item.role}, {where}) {text}")
            sources.append({"kind": "message", "location": where, "message_id": item.id})
    header = f'[recollection from the archive for "{query}": recalled material, not a new request]'
    body = "\n".join(items) if items else "- nothing matching was found in the archive"
    text = f"{header}\n{body}\n[end of recollection]"
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
    return Message(role="user", content=(TextBlock(text),), id=f"recollection-{digest}", name=RECOLLECTION_NAME,
                   metadata={"layer": RECOLLECTION_NAME, "recollection": {"query": query, "sources": sources}})


def _message_text(message: Message) -> str:
    text = message_search_text(message.to_dict())
    return re.sub(r"[ \t]+", " ", text).strip()
