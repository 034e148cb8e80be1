"""What an agent keeps beyond its live context.

``long_term`` (``MEMORY.md`` and the day's notes, in CoPaw's layout),
``working`` (operation history and the state of the files it touched),
``retrieval`` (search over everything the workspace keeps outside the context),
``pins`` (messages and facts a person pinned through compactions) and
``reinject`` (putting an original back into the live context).
"""

from __future__ import annotations
