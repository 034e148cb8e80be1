"""How a ``ContextManager`` is saved between turns and taken back.

The engine keeps one agent's context in memory; a caller that outlives a
process (the web app, a replay resumed later) stores ``export_state`` (or the
smaller ``export_header`` plus its own per-message rows) and rebuilds the
manager with ``ContextManager.from_state``, which calls ``restore_state``.
Everything here is bookkeeping of the hook's own fields: no decision of a turn
is taken in this module.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from contextlab.engine.core.messages import Message, ToolUseBlock
from contextlab.engine.memory.pins import Pins
from contextlab.engine.memory.working import LiveFileTracker
from contextlab.engine.stages.compaction import SummaryVersion

if TYPE_CHECKING:
    from contextlab.engine.core.profile import Profile
    from contextlab.engine.stages.archive import DialogArchive


class SavedState:
    """The save and restore half of ``ContextManager`` (a mixin: the fields are the hook's)."""

    profile: Profile
    transactional: bool
    archive: DialogArchive
    recovered_files: list[str]
    messages: list[Message]
    system_prompt: str
    tools: list[dict[str, Any]]
    response_format: dict[str, Any] | None
    turn: int
    summary: str | None
    summary_language: str | None
    summaries: list[SummaryVersion]
    archived_ids: list[str]
    externalized: dict[str, str]
    fate: dict[str, list[dict[str, Any]]]
    ledger: dict[str, dict[str, Any]]
    pinned_ids: list[str]
    pins: Pins
    files: LiveFileTracker
    stale: dict[str, dict[str, Any]]
    _ids: set[str]
    _calls: dict[str, ToolUseBlock]
    _answered: set[str]
    _pending_calls: dict[str, str]
    _recent: deque[str]
    _slid_out: list[str]
    _added: list[str]
    _changed: list[str]
    _removed: list[str]
    _archive_files: set[str]
    _gone: set[str]
    _live_tokens: int
    _live_exact: int
    _live_estimate: int

    if TYPE_CHECKING:
        @property
        def summary_version(self) -> int: ...

        def live_ids(self) -> list[str]: ...

        def _add_live(self, msg: Message) -> None: ...

    def commit(self) -> None:
        """The caller has saved the state of the last turn (transactional mode)."""
        self.archive.commit(turn=self.turn)

    def export_state(self, *, history: bool = True, per_message: bool = True) -> dict[str, Any]:
        """The in-memory state as JSON-ready data (the workspace holds the rest).

        With ``history=False`` the fate and ledger of messages no longer live,
        and the arguments of their tool calls, are left out: a caller that keeps
        those elsewhere (the web app stores them per message) then pays for the
        live context only, not for everything the session ever saw.

        With ``per_message=False`` (implies ``history=False``) what a caller
        stores per message is left out too: the live messages (only their ids,
        in order, under ``live_ids``), their fate and ledger, every id ever seen
        and the archived ids. Such a header is small and does not grow with the
        live context; ``from_state`` takes it back once the caller has put those
        keys in again (the ledger of a live message is in its metadata).
        """
        if not per_message:
            header = self._export(history=False, messages=False)
            for key in ("messages", "fate", "ledger", "ids", "archived_ids"):
                header.pop(key)
            header["live_ids"] = [m.id for m in self.messages]
            return header
        return self._export(history=history, messages=True)

    def export_header(self) -> dict[str, Any]:
        """``export_state(per_message=False)`` without the three parts that grow with the
        session: the live ids, every tool call seen and every answered call id. Its size
        follows what the session holds besides its messages and calls, so a caller can
        store it on every commit; that caller keeps the rest itself (the order of its
        message rows, ``calls_seen``, ``answered_call_ids``) and puts ``messages``,
        ``calls`` and ``answered`` back before ``from_state``.
        """
        header = self._export(history=False, messages=False, calls=False)
        for key in ("messages", "fate", "ledger", "ids", "archived_ids", "calls", "answered"):
            header.pop(key)
        return header

    def calls_seen(self) -> Mapping[str, ToolUseBlock]:
        """Every tool call ingested and not taken back, by call id (read only: the engine's own)."""
        return MappingProxyType(self._calls)

    def answered_call_ids(self) -> AbstractSet[str]:
        """The ids of the calls whose result was ingested (read only: the engine's own set)."""
        return self._answered

    def _export(self, *, history: bool, messages: bool, calls: bool = True) -> dict[str, Any]:
        live = {m.id for m in self.messages} if not history else set()
        # Runs on every commit: no list per message (``tool_uses`` builds one), and
        # no pass at all when no call's arguments could be left out.
        live_calls = ({b.id for m in self.messages for b in m.content if isinstance(b, ToolUseBlock)}
                      | set(self._pending_calls) if calls and not history and self._calls else set())
        # A header (messages=False) leaves fate and ledger out: not worth a pass over them.
        fate = self.fate if history else {k: v for k, v in self.fate.items() if k in live} if messages else {}
        ledger = self.ledger if history else {k: v for k, v in self.ledger.items()
                                              if k.rpartition("#")[0] in live} if messages else {}
        known_calls = {k: {"id": v.id, "name": v.name, "input": v.input if history or k in live_calls else {},
                           "raw_input": v.raw_input if history or k in live_calls else None}
                       for k, v in self._calls.items()} if calls else {}
        return {
            "state_version": 1,
            "system_prompt": self.system_prompt,
            "tools": self.tools,
            "response_format": self.response_format,
            "turn": self.turn,
            "summary": self.summary,
            "summary_language": self.summary_language,
            "summaries": [s.to_dict() for s in self.summaries],
            # Token counts travel with the messages, so restoring a session
            # does not re-encode its whole live context.
            "messages": [self.message_form(m) for m in self.messages] if messages else [],
            # A header (messages=False) drops these two: not worth building (they grow with history).
            "archived_ids": list(self.archived_ids) if messages else [],
            "externalized": dict(self.externalized),
            "fate": fate,
            "ledger": ledger,
            "ids": sorted(self._ids) if messages else [],
            "calls": known_calls,
            "archive_files": sorted(self._archive_files),
            "answered": sorted(self._answered) if calls else [],
            "pending_calls": self._pending_calls,
            "recent": list(self._recent),
            "slid_out": list(self._slid_out),
            "pinned_ids": list(self.pinned_ids),
            "pins": self.pins.to_dict(),
            # The delta since the last turn: an append saved in one request and
            # the hook run in the next must still show the appended messages.
            "pending_delta": {"added": list(self._added), "changed": list(self._changed),
                              "removed": list(self._removed)},
            "files": self.files.to_dict(),
            "stale": {k: v for k, v in self.stale.items() if history or k in live},
            "gone": sorted(self._gone) if history else [],
        }

    @staticmethod
    def message_form(msg: Message) -> dict[str, Any]:
        """One live message as ``export_state`` stores it, with its token counts."""
        return {**msg.to_dict(), "token_memo": dict(msg._token_memo)}

    def restore_state(self, state: dict[str, Any]) -> None:
        """Put back what ``export_state`` saved, on a manager just built for the same profile."""
        # A turn archived but never saved (a crash in between) is undone here;
        # only a transactional caller (which holds the session's lock) may do it.
        if self.transactional:
            self.recovered_files = self.archive.recover(committed_turn=int(state.get("turn", 0)))
        self.turn = int(state.get("turn", 0))
        self.summary = state.get("summary")
        self.summary_language = state.get("summary_language")
        self.summaries = [SummaryVersion(**s) for s in state.get("summaries", [])]
        self.archived_ids = list(state.get("archived_ids", []))
        self.externalized = dict(state.get("externalized", {}))
        self.fate = dict(state.get("fate", {}))
        self.ledger = dict(state.get("ledger", {}))
        self._ids = set(state.get("ids", []))
        self._calls = {k: ToolUseBlock(id=v["id"], name=v["name"], input=v["input"], raw_input=v["raw_input"])
                          for k, v in state.get("calls", {}).items()}
        self._answered = set(state.get("answered", []))
        self._pending_calls = dict(state.get("pending_calls", {}))
        self._recent = deque(state.get("recent", []))
        self._slid_out = list(state.get("slid_out", []))
        self.pinned_ids = list(state.get("pinned_ids", []))
        self.pins = Pins.from_dict(state.get("pins"))
        self._archive_files = set(state.get("archive_files", []))
        self.files = LiveFileTracker.from_dict(state.get("files") or {})
        delta = state.get("pending_delta") or {}
        self._added = list(delta.get("added", []))
        self._changed = list(delta.get("changed", []))
        self._removed = list(delta.get("removed", []))
        self.stale = dict(state.get("stale") or {})
        # A lean state has no "gone" list, but then it keeps only live stale reads.
        self._gone = set(state.get("gone") or [])
        for data in state.get("messages", []):
            msg = Message.from_dict(data)
            msg._token_memo.update(data.get("token_memo") or {})
            self.messages.append(msg)
            self._add_live(msg)


    def snapshot(self) -> dict[str, Any]:
        """Everything a caller needs to show or store the current state."""
        return {
            "turn": self.turn,
            "policy": self.profile.policy,
            "summary": self.summary,
            "summary_version": self.summary_version,
            "live_message_ids": self.live_ids(),
            "archived_message_ids": list(self.archived_ids),
            "tokens": {"live": self._live_tokens, "exact": self._live_exact, "estimate": self._live_estimate},
        }
