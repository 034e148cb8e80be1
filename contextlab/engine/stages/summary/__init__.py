"""The summary of a compaction: asking for it, staging it, and checking it.

``prompts`` (what the summary model reads and the wrapper of its answer),
``plan`` (compaction in three stages so a caller never holds a lock while the
summary model answers), ``validity`` (is a summary usable, and its sections),
``identifiers`` (the identifiers a summary must keep, and the index of those
it moved out).
"""

from __future__ import annotations
