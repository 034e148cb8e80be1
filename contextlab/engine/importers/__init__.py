"""Read-only import of recorded agent transcripts.

``load_transcript(path)`` recognises the format from the file's content (the
extension is never trusted: ``.jsonl`` files that hold one JSON array exist in
the wild), converts it to engine messages and repairs the sequence so that it
passes ``check_sequence``. Every message carries ``metadata["source_index"]``
and ``metadata["source_format"]`` so the dashboard can point back at the record
it came from.

Besides the seven agent formats, one recorded chat-completions request (the
body, or a capture holding it under ``body``) imports as ``openai_request``
with its tool definitions; a plain list of OpenAI, Anthropic or AgentScope
messages (a JSON array, or one message per line like CoPaw's
``dialog/*.jsonl``) imports as ``openai_messages`` / ``anthropic_messages`` /
``agentscope_messages``, and ContextLab's own message form
(``Message.to_dict()``) as ``contextlab_messages``. ``Transcript.tools`` holds
the tool definitions a format records (OpenHands, SWE-agent in
function-calling mode, a recorded request); Claude Code, tau-bench, LangGraph,
DeerFlow and ReMe files record none.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from contextlab.engine.core.errors import MalformedInput
from contextlab.engine.importers import (
    chat_request,
    claude_code,
    contextlab_messages,
    deerflow_sse,
    langgraph,
    message_list,
    openhands,
    reme_list,
    swe_agent,
    tau_bench,
)
from contextlab.engine.importers._common import (
    KNOWN_FORMATS,
    ParseBudget,
    Source,
    Transcript,
    read_source,
    unknown_format,
)

__all__ = ["KNOWN_FORMATS", "ParseBudget", "Transcript", "detect_transcript_format", "load_transcript"]

# Most specific first: ReMe lists are also OpenAI-like message lists.
_IMPORTERS: tuple[ModuleType, ...] = (
    claude_code,
    openhands,
    swe_agent,
    tau_bench,
    langgraph,
    deerflow_sse,
    reme_list,
    chat_request,
    contextlab_messages,
    message_list,
)


def _importer_for(source: Source) -> tuple[ModuleType, str]:
    if source.kind == "json" and source.value in ([], {}):
        # Valid JSON of no particular shape: say what is wrong, not "unknown format".
        raise MalformedInput("the file holds no messages (an empty JSON document)", field="file")
    for module in _IMPORTERS:
        fmt = module.matches(source)
        if fmt:
            return module, fmt if isinstance(fmt, str) else str(module.FORMAT)
    shape = {"json": "a JSON document", "jsonl": "JSON Lines", "sse": "a server-sent event stream"}[source.kind]
    raise unknown_format(f"{shape} of no known shape")


def detect_transcript_format(path: str | Path, budget: ParseBudget | None = None) -> str:
    """The format name of a transcript file, recognised from its content."""
    return _importer_for(read_source(path, budget))[1]


def load_transcript(path: str | Path, budget: ParseBudget | None = None) -> Transcript:
    """Import a recorded transcript; see the module docstring. What it parses counts against
    ``budget`` (an upload's), by default one set by the file's size."""
    source = read_source(path, budget)
    module, fmt = _importer_for(source)
    transcript: Transcript = module.load(source, fmt) if module is message_list else module.load(source)
    return transcript
