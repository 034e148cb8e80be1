"""Where the shared transcript corpus and reference files live for the tests."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.getenv("CONTEXTLAB_SHARED_DIR", REPO.parent / "shared"))
CORPUS = Path(os.getenv("CONTEXTLAB_CORPUS_DIR", SHARED / "corpus" / "raw"))

# The 13 transcripts, relative to CORPUS.
TRANSCRIPTS = [
    "marot-spotter/fa812bfe-b295-4cca-9c2f-fdf01028cb46.jsonl",
    "marot-spotter/fa812bfe-b295-4cca-9c2f-fdf01028cb46/subagents/agent-acompact-70d8e7.jsonl",
    "marot-spotter/ae4a77f8-aedd-4bc1-888f-c94edc91af04.jsonl",
    "marot-spotter/ae4a77f8-aedd-4bc1-888f-c94edc91af04/subagents/agent-aac57f5.jsonl",
    "marot-spotter/258c7280-ae70-4798-800f-63464d01a85d/subagents/agent-a881341.jsonl",
    "openhands/multi_swe_bench_output.ponylang__ponyc-4588.jsonl",
    "tau-bench/gpt-4o-airline.idx52.task2.trial1.json",
    "deer-flow/demo-threads/fe3f7974-1bcb-4a01-a950-79673baafefd/thread.json",
    "deer-flow/demo-threads/b83fbb2a-4e36-4d82-9de0-7b2a02c2092a/thread.json",
    "deer-flow/demo-threads/5aa47db1-d0cb-4eb9-aea5-3dac1b371c5a/thread.json",
    "deer-flow/v1-replay/china-food-delivery.txt",
    "reme/cookbook-simple_demo-messages.jsonl",
    "swe-agent/replay__marshmallow-1867__function_calling_replace_from_source.traj",
]


def corpus_path(relative: str) -> Path:
    path = CORPUS / relative
    if not path.exists():
        raise FileNotFoundError(
            f"corpus file {path} is missing: set CONTEXTLAB_CORPUS_DIR to the folder holding the raw transcripts"
        )
    return path

# A real CoPaw 1.0.2 run: its workspace, the 75 requests it sent and what happened.
COPAW_RUN = SHARED / "corpus" / "copaw-1.0.2"
