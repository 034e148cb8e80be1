"""The policies: what the hook decides at each turn.

``base`` is the interface and the registry by name (``build_policy``); the
manager imports only it. Each policy is a package of its own:

- ``copaw/``: CoPaw 1.0.2 + ReMe 0.3.1.8 reproduced on purpose, quirks
  included (``reference`` holds CoPaw's functions, ``shape`` its message shape);
- ``contextlab/``: ContextLab's own policy, which fixes CoPaw's ways of losing
  context and names each flaw it avoided (``flaw_notes``);
- ``eviction/``: structured eviction of information units instead of one summary.
"""

from __future__ import annotations
