"""The pre-reasoning hook: what runs before every LLM call, for both policies.

``ContextManager`` holds one agent's short-term context (system prompt, live
messages, current summary) and its workspace on disk. ``append`` ingests
messages (stage-1 truncation of tool results happens here, when a result is
written into the context); ``prepare`` runs the hook and returns the exact
payload for the next LLM call with the turn's trace; ``compact`` runs a manual
compaction, after ``preview_compaction`` has shown the split.

The ``contextlab`` policy follows seed 001 and fixes CoPaw's ways of losing
context; the ``copaw`` policy reproduces CoPaw 1.0.2 + ReMe 0.3.1.8 through
``contextlab.engine.policies.copaw.reference`` so a CoPaw user sees exactly what their agent did.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import datetime as dt
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contextlab.engine.compactors import build_compactor
from contextlab.engine.compactors.base import Compactor
from contextlab.engine.compactors.extractive import ExtractiveCompactor
from contextlab.engine.core.errors import MalformedInput
from contextlab.engine.core.messages import (
    Message,
    ToolResultBlock,
    ToolUseBlock,
    check_sequence,
)
from contextlab.engine.core.profile import Profile
from contextlab.engine.core.schemas import check_response_format, check_tools
from contextlab.engine.core.schemas import schema_tokens as count_schema_tokens
from contextlab.engine.core.tokens import REPLY_PRIMING_TOKENS, CopawEstimator, TiktokenCounter, TokenCounter
from contextlab.engine.core.trace import Observer, StepRecord, TurnTrace
from contextlab.engine.memory.pins import Pinning, Pins
from contextlab.engine.memory.working import LiveFileTracker
from contextlab.engine.policies.base import Policy, build_policy
from contextlab.engine.saved_state import SavedState
from contextlab.engine.stages.archive import DialogArchive
from contextlab.engine.stages.compaction import CompactionSteps, SummaryVersion
from contextlab.engine.stages.split import SplitPreview
from contextlab.engine.stages.summary.identifiers import (
    extract_identifiers,
    fold,
    is_internal,
    mentions,
)
from contextlab.engine.stages.summary.plan import (
    CompactionDraft,
    CompactionPlan,
    DryArchive,
    DryOffloadStore,
    PlannedCompactor,
    PlannedSummary,
    PlanningCompactor,
    SummaryNeeded,
)
from contextlab.engine.stages.summary.prompts import language_of_summary, summary_language
from contextlab.engine.stages.tool_result_cuts import ToolResultCuts
from contextlab.engine.stages.tool_results import (
    block_text,
    check_utf8,
)
from contextlab.engine.stages.truncation import (
    OffloadStore,
)


@dataclass(frozen=True)
class AgentCompaction:
    """An agent's own compaction, as the messages it sent next show it (``adopt_agent_compaction``)."""

    agent: str  # who compacted: "Claude Code", "Codex"
    kind: str  # how: "/compact", "local compaction", "remote compaction"
    summary: str = ""  # its summary text, "" when there is none to read
    opaque: bool = False  # the provider encrypted the summary
    tokens_before: int = 0  # the provider's usage before and after, when known
    tokens_after: int = 0


@dataclass
class TurnResult:
    """What ``prepare``/``compact`` hand back: the payload and the trace."""

    payload: list[Message]
    trace: TurnTrace
    summary_message: Message | None = None
    # The engine's converted forms of its messages (``to_openai``), shared by its turns.
    openai_forms: dict[int, Any] | None = field(default=None, repr=False, compare=False)
    # The payload in OpenAI's form, converted once: a caller sends it upstream
    # and stores it, and converting costs a pass over every live message.
    _openai: list[dict[str, Any]] | None = field(default=None, init=False, repr=False, compare=False)

    def openai_messages(self) -> list[dict[str, Any]]:
        """The payload as OpenAI chat messages (a new list; what its message dicts hold is shared, do not change it)."""
        from contextlab.engine.convert.openai import to_openai

        if self._openai is None:
            self._openai = to_openai(self.payload, self.openai_forms)
        return [dict(item) for item in self._openai]


class ContextManager(ToolResultCuts, CompactionSteps, Pinning, SavedState):
    def __init__(
        self,
        profile: Profile,
        workspace: str | Path,
        *,
        system_prompt: str = "",
        compactor: Compactor | None = None,
        observer: Observer | None = None,
        clock: Callable[[], dt.datetime] | None = None,
        memory_workspace: str | Path | None | bool = True,
        transactional: bool = False,
        tools: list[dict[str, Any]] | None = None,
        response_format: dict[str, Any] | None = None,
    ) -> None:
        self.profile = profile
        self.workspace = Path(workspace)
        self.workspace.mkdir(parents=True, exist_ok=True)
        self.system_prompt = system_prompt
        self.observer = observer
        # Each live message's OpenAI form, kept from turn to turn (``TurnResult.openai_messages``).
        self._openai_forms: dict[int, Any] = {}
        # A caller that saves the state in its own transaction (the web app)
        # journals the archive and calls commit() after saving; see DialogArchive.
        self.transactional = transactional
        # Where MEMORY.md and memory/YYYY-MM-DD.md live: the session workspace by
        # default, an agent-wide folder when the caller has one, off with False.
        self.recovered_files: list[str] = []
        self.memory_workspace: Path | None = (
            self.workspace if memory_workspace is True else
            None if memory_workspace in (False, None) else Path(str(memory_workspace)))
        self.clock = clock or (lambda: dt.datetime.now(dt.UTC))
        self.exact_counter: TokenCounter = TiktokenCounter(profile.tokenizer)
        self.estimator: TokenCounter = CopawEstimator(profile.estimate_divisor)
        self.policy: Policy[ContextManager] = build_policy(profile.policy)
        # The counter the policy decides with: exact, except CoPaw's estimate
        # for the copaw policy (so a replay sees the numbers CoPaw saw).
        self.counter = self.exact_counter if self.policy.exact_counts else self.estimator
        # Tool definitions and the response-format schema of the next call: a
        # fixed layer of the budget, like the system prompt (see schemas.py).
        self.tools: list[dict[str, Any]] = []
        self.response_format: dict[str, Any] | None = None
        self.schema_tokens = 0
        self.set_request_schemas(tools, response_format)
        self.compactor = compactor or self._default_compactor()
        self.fallback_compactor = ExtractiveCompactor()
        self.offload = OffloadStore(self.workspace)
        self.archive = DialogArchive(self.workspace)

        self.messages: list[Message] = []
        self.summary: str | None = None
        # The language of the first summary, kept for every later one (profile "auto").
        self.summary_language: str | None = None
        self.summaries: list[SummaryVersion] = []
        self.turn = 0
        self.traces: list[TurnTrace] = []
        self.archived_ids: list[str] = []
        # Message id -> key of its original under externalized/ (eviction policy).
        self.externalized: dict[str, str] = {}
        self.fate: dict[str, list[dict[str, Any]]] = {}
        self.ledger: dict[str, dict[str, Any]] = {}  # "<msg id>#<block>" -> entry

        self._ids: set[str] = set()
        self._calls: dict[str, ToolUseBlock] = {}
        self._answered: set[str] = set()
        self._pending_calls: dict[str, str] = {}  # call id -> message id
        self._live_tokens = 0  # policy counter, live messages
        self._live_exact = 0
        self._live_estimate = 0
        self._tool_tokens = 0  # policy counter, tool-result messages
        # Newest tool results first out; those pushed past recent_n wait here
        # for stage 2 in the next hook run (contextlab policy).
        self._recent: deque[str] = deque()
        self._slid_out: list[str] = []
        # The newest user message pinned by the last compaction (contextlab):
        # live = pinned + a contiguous suffix, until the next compaction.
        self.pinned_ids: list[str] = []
        # What a person pinned for the coming compactions (see ``pins``).
        self.pins = Pins()
        # False on the throwaway copy of a dry run: no index, dump or note file is written.
        self.writes_files = True
        # What changed in the payload since the previous turn; the trace stores
        # these deltas instead of the whole id list, so a long session's trace
        # stays linear in size and a turn's cost does not grow with the session.
        self._added: list[str] = []
        self._changed: list[str] = []
        self._removed: list[str] = []
        self._archive_files: set[str] = set()
        # Reads whose file was written later in the session: the model is
        # looking at an old version (message id -> what made it stale).
        self.files = LiveFileTracker()
        self.stale: dict[str, dict[str, Any]] = {}
        self._gone: set[str] = set()  # ids that left the live context
        self._text_tokens: dict[tuple[str, str, str], int] = {}
        self._summary_cache: tuple[str | None, int, Message | None] = (None, 0, None)
        # Staged compaction (see contextlab.engine.stages.summary.plan): the summary a turn
        # takes instead of calling the compactor, and whether a turn must not
        # summarise at all because another request's summary call is in flight.
        self._planned: PlannedSummary | None = None
        self._defer_summary = False

    # ------------------------------------------------------------------ setup
    def _default_compactor(self) -> Compactor:
        p = self.profile
        if p.compactor == "openai":
            return build_compactor(
                "openai",
                base_url=p.compaction_base_url or None,
                model=p.compaction_model,
                api_key_env=p.compaction_api_key_env,
                timeout=p.compaction_timeout,
                retries=p.compaction_retries,
                constrained_output=p.compaction_constrained_output,
            )
        return build_compactor("extractive")

    def set_request_schemas(self, tools: Any, response_format: Any) -> None:
        """The tools and response format the next LLM call declares (None: none)."""
        self.tools = check_tools(tools)
        self.response_format = check_response_format(response_format)
        self.schema_tokens = count_schema_tokens(self.exact_counter, self.tools, self.response_format)

    @property
    def planned(self) -> PlannedSummary | None:
        """The summary of a staged compaction this turn applies (see ``plan_compaction``), if any."""
        return self._planned

    @property
    def defer_summary(self) -> bool:
        """This turn must not summarise: another caller's summary call is in flight."""
        return self._defer_summary

    @property
    def summary_version(self) -> int:
        return self.summaries[-1].version if self.summaries else 0

    # ------------------------------------------------------------- counting
    @property
    def live_tokens(self) -> int:
        """Tokens of the live messages, by the policy's counter."""
        return self._live_tokens

    @property
    def live_exact_tokens(self) -> int:
        return self._live_exact

    @property
    def live_estimate_tokens(self) -> int:
        """What CoPaw's byte estimator says of the same messages."""
        return self._live_estimate

    def tokens_of(self, msg: Message) -> int:
        return self.counter.count_message(msg)

    def _add_live(self, msg: Message) -> None:
        t = self.tokens_of(msg)
        self._live_tokens += t
        self._live_exact += self.exact_counter.count_message(msg)
        self._live_estimate += self.estimator.count_message(msg)
        if msg.is_tool_result:
            self._tool_tokens += t

    def _remove_live(self, msg: Message) -> None:
        t = self.tokens_of(msg)
        self._live_tokens -= t
        self._live_exact -= self.exact_counter.count_message(msg)
        self._live_estimate -= self.estimator.count_message(msg)
        if msg.is_tool_result:
            self._tool_tokens -= t

    def replace_message(self, index: int, new: Message) -> None:
        self._remove_live(self.messages[index])
        self.messages[index] = new
        self._add_live(new)
        self._changed.append(new.id)

    def replace_all(self, messages: list[Message], *, archived: Iterable[str],
                    externalized: dict[str, str]) -> None:
        """Swap in a whole new live list (the eviction policy's result).

        ``archived`` ids went to the dialog archive; ``externalized`` maps ids
        to the key of the ``externalized/`` entry that holds their original.
        """
        before = {m.id: m for m in self.messages}
        for old in self.messages:
            self._remove_live(old)
        self.messages = list(messages)
        for new in self.messages:
            self._add_live(new)
            if new.id not in before:
                self._added.append(new.id)
            elif before[new.id] is not new:
                self._changed.append(new.id)
        now = {m.id for m in self.messages}
        self._removed.extend(mid for mid in before if mid not in now)
        self._gone.update(mid for mid in before if mid not in now)
        self.archived_ids.extend(mid for mid in archived if mid not in self.externalized)
        for mid, key in externalized.items():
            # The first key holds the true original; a later eviction of the
            # placeholder only stores the placeholder again.
            self.externalized.setdefault(mid, key)

    def note_archive_files(self, files: Iterable[str]) -> None:
        self._archive_files.update(files)

    def unread_result_ids(self) -> set[str]:
        """Tool-result messages after the last assistant message: the model has not read them yet."""
        unread: set[str] = set()
        for msg in reversed(self.messages):
            if msg.role == "assistant":
                break
            if msg.is_tool_result:
                unread.add(msg.id)
        return unread

    def call_of(self, call_id: str) -> ToolUseBlock | None:
        """The tool call with that id, wherever it is (live, archived or pending)."""
        return self._calls.get(call_id)

    def _index_of(self, msg_id: str) -> int | None:
        """Position of a live message, searched from the tail, where the hook's
        work happens (results sliding out of recent_n are near the end)."""
        for index in range(len(self.messages) - 1, -1, -1):
            if self.messages[index].id == msg_id:
                return index
        return None

    def _text_message_tokens(self, counter: TokenCounter, role: str, text: str) -> int:
        if not text:
            return 0
        key = (counter.key, role, text)
        if key not in self._text_tokens:
            if len(self._text_tokens) > 64:
                self._text_tokens.clear()
            self._text_tokens[key] = counter.count_message(Message.text(role, text, id="_probe"))  # type: ignore[arg-type]
        return self._text_tokens[key]

    def summary_message(self) -> Message | None:
        """The summary as injected into the payload (built once per summary version)."""
        if not self.summary:
            return None
        cached_text, cached_version, cached = self._summary_cache
        if cached is not None and cached_text is self.summary and cached_version == self.summary_version:
            return cached
        msg = self._build_summary_message()
        self._summary_cache = (self.summary, self.summary_version, msg)
        return msg

    def _build_summary_message(self) -> Message:
        assert self.summary is not None
        text = self.policy.summary_text(self, self.summary)
        return Message.text("user", text, id=f"summary-v{self.summary_version}", name="summary",
                            metadata={"layer": "summary", "summary_version": self.summary_version})

    def language_for_summary(self, messages: Sequence[Message]) -> str:
        """The summary's language, fixed for the session once chosen (see ``summary_language``)."""
        if self.summary_language is None and self.summary:
            self.summary_language = language_of_summary(self.summary)
        self.summary_language = summary_language(self.profile.summary_language, self.summary_language, messages)
        return self.summary_language

    def archive_hint(self) -> str:
        files = sorted(self._archive_files)
        if not files:
            return "dialog/YYYY-MM-DD.jsonl"
        if len(files) == 1:
            return files[0]
        return f"{files[0]} … {files[-1]}"

    # ------------------------------------------------------------- ingest
    def append(self, messages: Iterable[Message]) -> list[Message]:
        """Validate and ingest messages; returns them as stored (stage 1 applied).

        The whole batch is checked before anything is written, so a bad batch
        leaves the context, the workspace and the counts untouched.
        """
        batch = list(messages)
        for index, msg in enumerate(batch):
            size = sum(len(block_text(b).encode("utf-8", "surrogatepass")) for b in msg.content)
            if size > self.profile.max_message_bytes:
                raise MalformedInput(
                    f"message {msg.id!r} holds {size:,} bytes, more than the "
                    f"{self.profile.max_message_bytes:,}-byte limit of this profile",
                    field=f"messages[{index}].content",
                )
            check_utf8(msg, index)
        check_sequence(
            batch,
            known_tool_uses=self._calls.keys(),
            known_ids=self._ids,
            pending_calls=self._pending_calls.keys(),
        )
        stored: list[Message] = []
        for msg in batch:
            for use in msg.tool_uses:
                self._calls[use.id] = use
                self._pending_calls[use.id] = msg.id
            for res in msg.tool_results:
                call_message_id = self._pending_calls.pop(res.id, None)
                self._answered.add(res.id)
                call = self._calls.get(res.id)
                if call is not None and call_message_id is not None:
                    self._note_stale_reads(call, call_message_id, res, msg.id)
            self._ids.add(msg.id)
            self._added.append(msg.id)
            self.fate[msg.id] = [{"event": "ingested", "before_turn": self.turn + 1}]
            if self.policy.cuts_on_ingest and msg.is_tool_result:
                msg = self._stage_one(msg)
            self.messages.append(msg)
            self._add_live(msg)
            stored.append(msg)
        return stored

    def _note_stale_reads(self, call: ToolUseBlock, call_message_id: str, result: ToolResultBlock,
                          result_message_id: str) -> None:
        for stale in self.files.observe(call, call_message_id, result, result_message_id):
            info = {"path": stale.path, "written_by": stale.written_by_message_id, "write_tool": stale.write_tool,
                    "read_tool": stale.read_tool, "before_turn": self.turn + 1}
            self.stale[stale.read_message_id] = info
            if stale.read_message_id in self.fate:
                self.fate[stale.read_message_id].append({"event": "stale", **info})

    # ------------------------------------------------------------ the hook
    def prepare(self, *, planned: PlannedSummary | None = None, defer_summary: bool = False) -> TurnResult:
        """Run the pre-reasoning hook and return the payload for the next LLM call.

        ``planned``: the summary of a staged compaction (``plan_compaction``),
        used instead of calling the compactor; ``StalePlan`` when it no longer
        applies. ``defer_summary``: another caller's summary call is in flight,
        so this turn keeps every message (the window guard still re-cuts tool
        output if the payload would not fit).
        """
        self.turn += 1
        trace = self._new_trace("auto")
        try:
            with self._staged(planned, defer_summary):
                self.policy.turn(self, trace)
        except Exception as exc:  # the trace must record what broke, then re-raise
            trace.error = f"{type(exc).__name__}: {exc}"
            trace.finish()
            self.traces.append(trace)
            raise
        return self._finish(trace)

    def compact(self, instruction: str | None = None, *, planned: PlannedSummary | None = None) -> TurnResult:
        """Manual compaction (``/compact [instruction]``): steps 3-4 on demand."""
        self.turn += 1
        trace = self._new_trace("manual")
        with self._staged(planned, False):
            self.policy.manual(self, trace, instruction)
        return self._finish(trace)

    def adopt_agent_compaction(self, messages: Iterable[Message], compaction: AgentCompaction) -> TurnResult:
        """The agent compacted its own context: the messages it sent since replace the live ones.

        The live messages go to the archive as a compaction of that agent (their
        fate says so; the summary history holds its summary), ``messages`` are
        ingested as the new live context, and the turn runs on them without a
        summary of its own: summarising the agent's fresh summary again would
        only lose more. The session goes on from there, so its earlier turns,
        fates and archive stay one history."""
        batch = list(messages)
        self.turn += 1
        trace = self._new_trace("agent")
        replaced = list(self.messages)
        identifiers = [i for i in extract_identifiers(replaced) if not is_internal(i.value)]
        # Calls the replaced messages left open are answered nowhere now; kept calls the agent
        # sends again are the same calls, not duplicates.
        self._pending_calls.clear()
        for use in (u for m in batch for u in m.tool_uses):
            self._calls.pop(use.id, None)
            self._answered.discard(use.id)
        self.mark_compressed(trace, replaced, compaction.summary or f"({compaction.agent}'s summary is opaque)",
                             None, fallback=False, trigger="agent")
        # The agent's summary is in its own messages: the engine adds none of its own.
        self.summary = None
        self.summaries[-1] = dataclasses.replace(self.summaries[-1], compactor=compaction.agent)
        self.append(batch)
        kept_text = fold(" ".join(m.plain_text() for m in batch))
        lost = [i.value for i in identifiers if not mentions(i.value, kept_text, folded=True)]
        with trace.step("agent_compaction", self.observer) as rec:
            rec.status = "fired"
            rec.numbers = {"replaced": len(replaced), "sent": len(batch), "lost_identifiers": len(lost),
                           **({"tokens_before": compaction.tokens_before} if compaction.tokens_before else {}),
                           **({"tokens_after": compaction.tokens_after} if compaction.tokens_after else {})}
            rec.details = {"agent": compaction.agent, "kind": compaction.kind, "summary": compaction.summary,
                           "opaque": compaction.opaque, "replaced_ids": [m.id for m in replaced],
                           "lost_identifiers": lost[:200]}
            rec.outcome = (f"{compaction.agent} compacted its own context ({compaction.kind}): "
                           f"{len(replaced)} message(s) replaced by the {len(batch)} it sent"
                           + (", its summary opaque (encrypted by the provider)" if compaction.opaque else ""))
            if lost:
                rec.reasons.append(f"{len(lost)} identifier(s) of the replaced messages are named nowhere in "
                                   "what the agent kept")
        try:
            with self._staged(None, True):
                self.policy.turn(self, trace)
        except Exception as exc:  # the trace must record what broke, then re-raise
            trace.error = f"{type(exc).__name__}: {exc}"
            trace.finish()
            self.traces.append(trace)
            raise
        if trace.outcome == "no_action":
            trace.outcome = "compacted"
        return self._finish(trace)

    @contextlib.contextmanager
    def _staged(self, planned: PlannedSummary | None, defer_summary: bool) -> Iterator[None]:
        compactor = self.compactor
        if planned is not None:
            self.compactor = PlannedCompactor(planned, compactor.name)
        self._planned, self._defer_summary = planned, defer_summary
        try:
            yield
        finally:
            self.compactor = compactor
            self._planned, self._defer_summary = None, False

    # ------------------------------------------------- staged compaction
    def plan_compaction(self, *, manual: bool = False, instruction: str | None = None) -> CompactionPlan | None:
        """What the next turn (``prepare``, or ``compact`` when ``manual``) would ask
        the compactor, or None when it would not ask it at all.

        Runs that turn on a throwaway copy whose compactor records the request;
        this engine and the workspace are left as they were.
        """
        if not self._may_summarise(manual=manual):
            return None
        clone = self._dry_copy(PlanningCompactor(self.compactor.name))
        try:
            if manual:
                clone.compact(instruction)
            else:
                clone.prepare()
        except SummaryNeeded as needed:
            return CompactionPlan(
                trigger="manual" if manual else "auto", instruction=instruction, turn=self.turn,
                summary_version=self.summary_version, live_ids=[m.id for m in self.messages],
                compact_ids=[m.id for m in needed.request.messages], request=needed.request)
        return None

    def _dry_copy(self, compactor: Compactor) -> ContextManager:
        """A throwaway copy of this engine that writes no file of the workspace."""
        # A deep copy: the exported state shares its fate lists and ledger
        # entries with this engine, and the dry run appends to them.
        clone = ContextManager.from_state(self.profile, self.workspace, copy.deepcopy(self.export_state()),
                                          compactor=compactor)
        clone.offload = DryOffloadStore(self.workspace)
        clone.archive = DryArchive(self.workspace)
        clone.memory_workspace = None
        clone.writes_files = False
        clone.clock = self.clock
        return clone

    def draft_compaction(self, planned: PlannedSummary) -> CompactionDraft:
        """What committing ``planned`` (a manual plan) would do now, without doing it.

        The commit turn runs on a throwaway copy, so the draft's summary is the
        exact text ``compact(planned=planned)`` would store on this state;
        ``StalePlan`` when the plan no longer applies.
        """
        clone = self._dry_copy(self.compactor)
        result = clone.compact(planned.plan.instruction, planned=planned)
        check = result.trace.get("context_check")
        changed = clone.summary_version != self.summary_version
        return CompactionDraft(
            outcome=result.trace.outcome or "",
            summary=clone.summary if changed else None,
            previous_summary=self.summary,
            summary_version=clone.summary_version,
            compact_ids=list(check.details.get("compact_ids", [])) if check else [],
            keep_ids=list(check.details.get("keep_ids", [])) if check else [],
            pins=self.pins.to_dict(),
            trace=result.trace.to_dict())

    def _may_summarise(self, *, manual: bool) -> bool:
        """Cheap and never wrong the wrong way: False only when the turn surely makes no summary call."""
        if self.profile.policy == "eviction" or not self.messages:
            return False
        if manual:
            return True
        left = self.profile.threshold - self._payload_overhead_tokens()
        # The contextlab hook summarises only when the live messages reach what
        # is left (stage two only shrinks them); CoPaw counts with its own
        # estimate of the same messages, hence the margin.
        margin = 1.0 if self.profile.policy == "contextlab" else 0.8
        return self._live_tokens >= left * margin

    def _payload_overhead_tokens(self) -> int:
        summary_msg = self.summary_message()
        return ((self.schema_tokens if self.policy.exact_counts else 0)
                + self._text_message_tokens(self.counter, "system", self.system_prompt)
                + (self.counter.count_message(summary_msg) if summary_msg else 0))

    def preview_compaction(self) -> SplitPreview:
        """Which messages a manual compaction would summarise and which it keeps."""
        return self.policy.preview(self)

    def _new_trace(self, trigger: str) -> TurnTrace:
        p = self.profile
        return TurnTrace(
            turn=self.turn,
            trigger=trigger,
            policy=p.policy,
            counter=self.counter.key,
            exact=self.counter.exact,
            budget={"window": p.max_input_length, "threshold": p.threshold, "reserve": p.reserve},
        )

    def gate(self, trace: TurnTrace) -> tuple[int, int, StepRecord]:
        p = self.profile
        with trace.step("gate", self.observer) as rec:
            system_tokens = self._text_message_tokens(self.counter, "system", self.system_prompt)
            summary_msg = self.summary_message()
            summary_tokens = self.counter.count_message(summary_msg) if summary_msg else 0
            # CoPaw counts messages only; every other policy counts the schemas too.
            tools_tokens = self.schema_tokens if self.policy.exact_counts else 0
            used = system_tokens + summary_tokens + tools_tokens
            left = p.threshold - used
            rec.inputs = {"system_prompt_chars": len(self.system_prompt),
                          "summary_version": self.summary_version}
            rec.numbers = {"threshold": p.threshold, "reserve": p.reserve, "system_tokens": system_tokens,
                           "summary_tokens": summary_tokens, "tools_tokens": tools_tokens, "used": used,
                           "left": left,
                           "messages_tokens": self._live_tokens, "messages_exact": self._live_exact,
                           "messages_estimate": self._live_estimate, "message_count": len(self.messages)}
            if left <= p.reserve:
                rec.status = "warning"
                rec.outcome = "over budget before any message"
                rec.reasons.append(
                    f"system prompt + summary + tool schemas use {used:,} of the {p.threshold:,}-token threshold, "
                    f"leaving {left:,}, not more than the {p.reserve:,}-token reserve")
            else:
                rec.outcome = f"{left:,} tokens left for messages"
        return used, left, rec

    def payload_tokens(self) -> int:
        """System prompt + summary + tool schemas + live messages, by the policy's counter."""
        summary_msg = self.summary_message()
        return ((self.schema_tokens if self.policy.exact_counts else 0)
                + self._text_message_tokens(self.counter, "system", self.system_prompt)
                + (self.counter.count_message(summary_msg) if summary_msg else 0) + self._live_tokens)

    def payload_exact_tokens(self) -> int:
        """What the payload of this turn costs, exactly as ``_finish`` reports it."""
        summary_msg = self.summary_message()
        return (self._text_message_tokens(self.exact_counter, "system", self.system_prompt)
                + (self.exact_counter.count_message(summary_msg) if summary_msg else 0)
                + self.schema_tokens + self._live_exact + REPLY_PRIMING_TOKENS)


    # ----------------------------------------------------------- the result
    def _finish(self, trace: TurnTrace) -> TurnResult:
        summary_msg = self.summary_message()
        payload: list[Message] = []
        if self.system_prompt:
            payload.append(Message.text("system", self.system_prompt, id="system",
                                        metadata={"layer": "system"}))
        if summary_msg is not None:
            payload.append(summary_msg)
        payload.extend(self.messages)
        with trace.step("result", self.observer) as rec:
            system_tokens = self._text_message_tokens(self.exact_counter, "system", self.system_prompt)
            summary_tokens = self.exact_counter.count_message(summary_msg) if summary_msg else 0
            tool_tokens = self._exact_tool_tokens()
            message_tokens = self._live_exact - tool_tokens
            total = system_tokens + summary_tokens + self.schema_tokens + self._live_exact + REPLY_PRIMING_TOKENS
            pinned = [mid for mid in self.pinned_ids if self.fate[mid][-1]["event"] != "compacted"]
            rec.numbers = {"system": system_tokens, "summary": summary_tokens, "messages": message_tokens,
                           "tool_results": tool_tokens, "tools": self.schema_tokens, "total": total, "window": self.profile.max_input_length,
                           "message_count": len(self.messages), "estimate_total": self._live_estimate}
            rec.status = "warning" if total > self.profile.max_input_length else "ok"
            rec.outcome = (f"{total:,} tokens sent: system prompt + "
                           f"{'summary v' + str(self.summary_version) + ' + ' if summary_msg else ''}"
                           f"{len(self.messages)} message(s)")
            # Costs the stale reads, not the session: liveness comes from the set
            # of ids that left the context.
            stale_live = [{"message_id": mid, **info} for mid, info in self.stale.items() if mid not in self._gone]
            if stale_live:
                rec.details["stale_reads"] = stale_live
                rec.reasons.append(f"{len(stale_live)} live read result(s) show an old version of a file "
                                   "written later in the session")
            # Originals an operator put back since the last turn (contextlab.engine.memory.reinject):
            # they were appended, so they are among the newest messages.
            tail = self.messages[-len(self._added):] if self._added else []
            added = set(self._added) if tail else set()
            reinjected = [{"message_id": m.id, "source_id": m.metadata["reinjected_from"]}
                          for m in tail if m.id in added and m.metadata.get("reinjected_from")]
            if reinjected:
                rec.details["reinjected"] = reinjected
                rec.reasons.append(f"{len(reinjected)} original(s) re-injected by the operator")
            trace.payload = {
                "message_count": len(self.messages),
                "first_message_id": self.messages[0].id if self.messages else None,
                "last_message_id": self.messages[-1].id if self.messages else None,
                "added_ids": self._added,
                "removed_ids": self._removed,
                "changed_ids": sorted(set(self._changed) - set(self._removed)),
                "pinned_message_ids": pinned,
                **({"reinjected": reinjected} if reinjected else {}),
                "summary_version": self.summary_version,
                "tokens": {"system": system_tokens, "summary": summary_tokens, "messages": message_tokens,
                           "tool_results": tool_tokens, "tools": self.schema_tokens, "total": total},
            }
        self._added, self._changed, self._removed = [], [], []
        trace.finish()
        self.traces.append(trace)
        return TurnResult(payload=payload, trace=trace, summary_message=summary_msg, openai_forms=self._openai_forms)

    def _exact_tool_tokens(self) -> int:
        if self.counter is self.exact_counter:
            return self._tool_tokens
        return sum(self.exact_counter.count_message(m) for m in self.messages if m.is_tool_result)

    # ------------------------------------------------------------ upkeep
    def referenced_files(self) -> set[str]:
        refs: set[str] = set()
        for msg in self.messages:
            for key in ("offload", "offload_args"):
                for entry in (msg.metadata.get(key) or {}).values():
                    refs.add(entry["file"])
        return refs

    def cleanup_offloaded(self, now: dt.datetime | None = None) -> list[str]:
        """Retention cleanup of ``tool_result/`` that spares every referenced file."""
        return self.offload.cleanup_expired(retention_days=self.profile.retention_days,
                                            referenced=self.referenced_files(), now=now)

    def retract_newest_reply(self) -> Message | None:
        """Take back the newest message when it is an assistant reply appended since the last turn.

        For a reply its client never received (it timed out, or asks for the
        answer again): the next reply replaces it. Only a message no turn has
        seen can go, so every recorded payload stays what it was. None when the
        newest message is not such a reply.
        """
        if not self.messages:
            return None
        msg = self.messages[-1]
        if msg.role != "assistant" or msg.id not in self._added:
            return None
        self.messages.pop()
        self._remove_live(msg)
        self._added.remove(msg.id)
        self._ids.discard(msg.id)
        self.fate.pop(msg.id, None)
        for use in msg.tool_uses:
            self._calls.pop(use.id, None)
            self._pending_calls.pop(use.id, None)
        return msg

    def call_names(self) -> dict[str, str]:
        """Tool name by call id, for every call seen so far (converters pair later results with them)."""
        return {call_id: call.name for call_id, call in self._calls.items()}

    def pending_tool_calls(self) -> list[str]:
        return sorted(self._pending_calls)

    def live_ids(self) -> list[str]:
        return [m.id for m in self.messages]

    # ------------------------------------------------------------ persistence
    @classmethod
    def from_state(
        cls,
        profile: Profile,
        workspace: str | Path,
        state: dict[str, Any],
        *,
        compactor: Compactor | None = None,
        observer: Observer | None = None,
        transactional: bool = False,
    ) -> ContextManager:
        manager = cls(profile, workspace, system_prompt=state.get("system_prompt", ""),
                      compactor=compactor, observer=observer, transactional=transactional,
                      tools=state.get("tools"), response_format=state.get("response_format"))
        manager.restore_state(state)
        return manager


# ---------------------------------------------------------------- helpers


def replay_turns(
    messages: Sequence[Message],
    manager: ContextManager,
    *,
    on_turn: Callable[[TurnResult, int], None] | None = None,
) -> TurnResult | None:
    """Feed ``messages`` in order; a turn (the hook) runs before each assistant message."""
    last: TurnResult | None = None
    pending: list[Message] = []
    for index, msg in enumerate(messages):
        if msg.role == "assistant" and (pending or manager.messages):
            if pending:
                manager.append(pending)
                pending = []
            last = manager.prepare()
            if on_turn is not None:
                on_turn(last, index)
        pending.append(msg)
    if pending:
        manager.append(pending)
    last = manager.prepare()
    if on_turn is not None:
        on_turn(last, len(messages))
    return last

