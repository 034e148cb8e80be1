"""Running recorded conversations through the hook, offline.

``transcript`` replays a recorded transcript turn by turn; ``whatif`` replays a
session's messages with the turn boundaries it really had; ``compare`` runs one
transcript under several policies; ``verify`` checks that every input message
is still somewhere, intact.
"""

from __future__ import annotations
