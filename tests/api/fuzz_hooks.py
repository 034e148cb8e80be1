"""Schemathesis hooks of the live fuzz (``SCHEMATHESIS_HOOKS=tests.api.fuzz_hooks``).

The world the server was seeded with (``tests.api.fuzz_world``) arrives as JSON
in ``CONTEXTLAB_FUZZ_WORLD``. Most generated requests name a session, turn and
run that exist, of every policy, so they reach the services instead of stopping
at a 404; one in four keeps the generated ids, for the 404s.
"""

from __future__ import annotations

import json
import os
from typing import Any

import hypothesis.strategies as st
import schemathesis

WORLD: dict[str, Any] = json.loads(os.environ.get("CONTEXTLAB_FUZZ_WORLD") or "{}")


def _existing(path_parameters: dict[str, Any], session_id: str, run_id: int) -> dict[str, Any]:
    known = {"session_id": session_id, "number": WORLD["number"], "run_id": run_id}
    return {**path_parameters, **{k: v for k, v in known.items() if k in path_parameters}}


@schemathesis.hook
def flatmap_path_parameters(context: Any, path_parameters: dict[str, Any] | None) -> Any:
    if not path_parameters or not WORLD:
        return st.just(path_parameters)
    sessions = [WORLD["session_id"], *WORLD["sessions"].values()]
    existing = [_existing(path_parameters, session_id, run_id)
                for session_id in sessions for run_id in WORLD.get("run_ids") or [WORLD["run_id"]]]
    return st.sampled_from([*existing, path_parameters])
