"""Workflows over sessions: the engine does the work, these modules persist it.

One module per workflow, so the one you need is found by its name:

* ``inputs``      the checks every workflow applies to what a client sends, and their errors;
* ``profiles``    creating and resolving profiles;
* ``persistence`` loading a session's engine under its row lock (or reusing the one this process
                  kept, while its state version is current) and writing what a step changed;
* ``summary_calls`` turns that may call the summary model: planned under the lock, the call with
                  nothing held, committed under the lock;
* ``live_state``  what the dashboard's viewers are pushed after a commit;
* ``turns``       sessions, appended messages and the pre-reasoning hook (``session_prepare``);
* ``compaction``  manual compaction, now or as a background run;
* ``compaction_review`` pins, a dry run's draft, its accept or discard, and cancelling a run;
* ``runs``        the life of a background run, and the sweep for runs whose worker died;
* ``imports``     importing a recorded transcript, now or in the background;
* ``bundles``     exporting and importing a whole session;
* ``retention``   pruning expired offloaded tool results;
* ``memory``      consolidating long-term memory per profile and day;
* ``what_if``     replaying a session under a profile's edited knobs, as a background run;
* ``reinject``    putting a compacted or cut message's original back into the live context.

Every function that changes a session runs the engine and writes the result in
one transaction holding a row lock on the session (``select_for_update``; on
SQLite the IMMEDIATE transactions of the settings serialise writers instead),
so two hooks, or a hook and a manual compaction, never interleave on one
session: the second waits and then starts from the state the first committed.
The one exception is the summary model's call, which may take its whole
timeout: it runs with no lock and no transaction open (``summary_calls``), and
its result is committed onto whatever the session holds by then.
The engine itself writes the dialog archive before it removes a message, so a
rollback after a file write leaves an extra archive line at worst, never a loss.

Callers use the workflow functions re-exported here (``services.session_prepare``).
"""
from __future__ import annotations

from contextlab.sessions.services.bundles import session_export, session_import_bundle
from contextlab.sessions.services.compaction import (
    compaction_active,
    compaction_enqueue,
    compaction_execute,
    compaction_preview,
    compaction_run,
    compaction_start,
    compaction_work,
)
from contextlab.sessions.services.compaction_review import (
    CompactionCancelled,
    DraftNotOpen,
    DraftStale,
    draft_accept,
    draft_discard,
    dry_run_start,
    latest_draft,
    pin_fact,
    pin_message,
    pins_of,
    run_cancel,
    unpin_fact,
    unpin_message,
)
from contextlab.sessions.services.imports import (
    transcript_import,
    transcript_import_enqueue,
    transcript_import_work,
)
from contextlab.sessions.services.inputs import (
    BUNDLE_FORMAT,
    MAX_INSTRUCTION_LENGTH,
    MAX_MESSAGE_ID_LENGTH,
    MAX_TITLE_LENGTH,
    PayloadTooLarge,
    RunInProgress,
    SessionUnavailable,
)
from contextlab.sessions.services.live_state import (
    current_live_view,
    latest_turn_inputs,
    pending_from_rows,
    run_announce,
    session_announce,
    system_prompt_tokens,
)
from contextlab.sessions.services.memory import (
    MemoryConsolidation,
    memory_consolidate,
    memory_consolidate_due,
    memory_day_due,
    profile_zone,
)
from contextlab.sessions.services.profiles import (
    profile_create,
    profile_default,
    profile_observed,
    profile_resolve,
)
from contextlab.sessions.services.reinject import message_reinject
from contextlab.sessions.services.retention import PruneResult, offloaded_prune
from contextlab.sessions.services.runs import NEVER_STARTED, WORKER_DIED, runs_reap, runs_recover
from contextlab.sessions.services.turns import (
    PendingTurn,
    check_usage,
    messages_append,
    messages_append_openai,
    pending_turn_apply_plan,
    pending_turn_commit,
    reported_prompt_tokens,
    session_advance,
    session_advance_pending,
    session_create,
    session_delete,
    session_new,
    session_prepare,
    session_repeat_pending,
    usage_report,
)
from contextlab.sessions.services.what_if import whatif_execute, whatif_stalled, whatif_start

__all__ = [
    "CompactionCancelled", "DraftNotOpen", "DraftStale", "draft_accept", "draft_discard", "dry_run_start",
    "latest_draft", "pin_fact", "pin_message", "pins_of", "run_cancel", "unpin_fact", "unpin_message",
    "BUNDLE_FORMAT", "MAX_INSTRUCTION_LENGTH", "MAX_MESSAGE_ID_LENGTH", "MAX_TITLE_LENGTH", "NEVER_STARTED",
    "WORKER_DIED", "MemoryConsolidation", "PayloadTooLarge", "PendingTurn", "PruneResult", "RunInProgress", "SessionUnavailable",
    "check_usage", "compaction_active", "compaction_enqueue", "compaction_execute", "compaction_preview", "compaction_run", "current_live_view",
    "compaction_start", "compaction_work", "memory_consolidate", "memory_consolidate_due", "memory_day_due",
    "messages_append", "messages_append_openai", "offloaded_prune", "pending_turn_apply_plan", "pending_turn_commit", "profile_create", "profile_default", "profile_observed",
    "latest_turn_inputs", "pending_from_rows", "profile_resolve", "profile_zone", "reported_prompt_tokens", "run_announce", "runs_reap", "runs_recover",
    "session_advance", "session_advance_pending", "session_announce", "session_create", "session_delete", "session_export",
    "session_import_bundle", "session_new", "session_prepare", "session_repeat_pending", "system_prompt_tokens", "transcript_import", "transcript_import_enqueue",
    "transcript_import_work", "usage_report", "message_reinject", "whatif_execute", "whatif_stalled", "whatif_start",
]
