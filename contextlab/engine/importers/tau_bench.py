"""tau-bench trajectories: ``{"task_id", "reward", "info", "traj", "trial"}``.

``traj`` is a plain OpenAI chat-completions message list (tool messages also
carry ``name``); the leading system message is the agent policy and becomes the
system prompt. The benchmark's task id, trial and reward go to the transcript
metadata. There are no timestamps, so every message is stamped with the file's
modification time and flagged ``timestamp_inferred``.
"""

from __future__ import annotations

from typing import Any

from contextlab.engine.importers._common import Source, Timeline, Transcript, finish_transcript
from contextlab.engine.importers.message_list import OpenAIRecord, convert_openai_records

FORMAT = "tau_bench"


def _is_trajectory(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("traj"), list)
        and all(isinstance(m, dict) and "role" in m for m in value["traj"][:3])
    )


def matches(source: Source) -> bool:
    value = source.value
    if source.kind != "json":
        return False
    # tau-bench's historical_trajectories files hold a list of runs.
    return _is_trajectory(value) or (isinstance(value, list) and bool(value) and _is_trajectory(value[0]))


def load(source: Source) -> Transcript:
    warnings: list[str] = []
    value: dict[str, Any]
    if isinstance(source.value, list):
        value = source.value[0]
        if len(source.value) > 1:
            warnings.append(f"the file holds {len(source.value)} trajectories; imported the first")
    else:
        value = source.value
    messages = convert_openai_records(
        (OpenAIRecord(i, m) for i, m in enumerate(value["traj"])), fmt=FORMAT, path="traj", timeline=Timeline(source.mtime)
    )
    meta: dict[str, Any] = {k: value[k] for k in ("task_id", "trial", "reward") if k in value}
    return finish_transcript(FORMAT, messages, warnings, source, meta)
