"""The steps of one turn of the hook, in the order they run.

1. gate (``ContextManager.gate`` in ``hook.py``): what the system prompt, the
   summary and the tool schemas leave for messages;
2. tool-result truncation, in two stages (``tool_result_cuts``, with the cutting
   and the offload store in ``truncation`` and the facts about calls in
   ``tool_results``): on ingest, and when a result slides out of the recent window;
3. split (``split``): where the history is cut, never between a call and its result;
4. summary (``summary/``): the prompt, the summary call staged so no lock is held
   while the model writes, the validity check and the identifiers it must keep;
5. archive (``archive``): the compacted originals to ``dialog/YYYY-MM-DD.jsonl``;
6. window fit (``window_fit``), last in every turn: when even the newest
   messages do not fit, their tool output and call arguments are shortened,
   the originals offloaded, so nothing is lost.

Which of these a turn runs, and how, is the policy's decision (``policies/``).
"""

from __future__ import annotations
