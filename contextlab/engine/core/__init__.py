"""The shared ground of the engine: what every stage, policy and reader works with.

``messages`` (the one message model), ``tokens`` (exact counts and CoPaw's
estimate), ``trace`` (the record of every decision of a turn), ``profile``
(every knob, with bounds), ``errors``; and small checks used throughout:
``paths`` (paths inside a workspace), ``unicode`` and ``strict_json`` (text and
JSON that can be stored and sent on), ``ansi`` (terminal codes), ``schemas``
(tool definitions as a layer of the budget).

Nothing here imports another package of the engine.
"""

from __future__ import annotations
