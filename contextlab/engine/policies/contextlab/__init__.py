"""The ``contextlab`` policy (``policy``) and the notes of what CoPaw would have done wrong (``flaw_notes``)."""

from __future__ import annotations
