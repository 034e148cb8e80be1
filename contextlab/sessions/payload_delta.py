"""A turn's payload stored as what changed since the previous turn's.

Consecutive payloads of a session share almost everything: the live context
grows by a few messages per turn, and a cut or a compaction changes a few more.
Storing each payload whole made every turn encode and write the entire live
context once more. A delta row holds instead a list of operations that rebuild
the payload from its base turn's:

* ``[start, stop]``: the base payload's messages ``start`` to ``stop`` (exclusive);
* ``{...}``: a message of its own (any JSON object, i.e. an OpenAI message).

Every ``KEYFRAME_EVERY`` turns (and whenever a delta would not be much smaller
than the payload) a turn stores its payload whole again, so rebuilding a turn
reads at most that many rows. The stored form names its keyframe, and the
rows from there on are read in one query.

No Django here: the model reads rows and hands them to ``rebuild``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# Longest chain of deltas between two whole payloads.
KEYFRAME_EVERY = 32


def is_delta(stored: Any) -> bool:
    return isinstance(stored, dict) and stored.get("form") == "delta"


def _key(message: Any) -> Any:
    """A cheap hashable stand-in for a message, to find where in the base it may sit."""
    if not isinstance(message, dict):
        return None
    content = message.get("content")
    return (message.get("role"), message.get("tool_call_id"), content if isinstance(content, str) else None)


def operations(base: Sequence[Any], payload: Sequence[Any]) -> tuple[list[Any], int]:
    """The operations that turn ``base`` into ``payload``, and how many messages they carry themselves.

    Runs of messages equal to a run of the base become one range; the rest is
    carried. The common case (the base, minus a cut prefix, plus new messages)
    costs one comparison per message; identical objects compare at once.
    """
    ops: list[Any] = []
    carried = 0
    positions: dict[Any, list[int]] | None = None
    run_start = run_stop = -1
    cursor = 0
    for message in payload:
        if cursor < len(base) and (base[cursor] is message or base[cursor] == message):
            if run_stop == cursor:
                run_stop += 1
            else:
                if run_start >= 0:
                    ops.append([run_start, run_stop])
                run_start, run_stop = cursor, cursor + 1
            cursor += 1
            continue
        if cursor >= len(base):
            # Past the end of the base: new messages (the common case), not worth a search.
            if run_start >= 0:
                ops.append([run_start, run_stop])
                run_start = run_stop = -1
            ops.append(message)
            carried += 1
            continue
        if positions is None:
            positions = {}
            for index, item in enumerate(base):
                positions.setdefault(_key(item), []).append(index)
        found = next((index for index in positions.get(_key(message), ()) if base[index] == message), None)
        if run_start >= 0:
            ops.append([run_start, run_stop])
            run_start = run_stop = -1
        if found is None:
            ops.append(message)
            carried += 1
        else:
            run_start, run_stop = found, found + 1
            cursor = found + 1
    if run_start >= 0:
        ops.append([run_start, run_stop])
    return ops, carried


def encode(base_number: int, keyframe: int, ops: list[Any]) -> dict[str, Any]:
    return {"form": "delta", "base": base_number, "keyframe": keyframe, "ops": ops}


class BrokenChain(ValueError):
    """A delta whose base row is missing or does not fit it."""


def apply(base: Sequence[Any], ops: Sequence[Any]) -> list[Any]:
    out: list[Any] = []
    for op in ops:
        if isinstance(op, dict):
            out.append(op)
        elif (isinstance(op, list) and len(op) == 2 and all(isinstance(i, int) and not isinstance(i, bool)
                                                          for i in op) and 0 <= op[0] <= op[1] <= len(base)):
            out.extend(base[op[0]:op[1]])
        else:
            raise BrokenChain(f"not a payload operation: {str(op)[:80]}")
    return out


def rebuild(number: int, stored: Any, rows: Mapping[int, Any]) -> list[Any]:
    """The whole payload of turn ``number`` stored as ``stored``, from the stored forms of
    its chain (``rows``: turn number to stored form, the keyframe's onwards)."""
    chain: list[Any] = []
    current, current_number = stored, number
    while is_delta(current):
        if len(chain) > KEYFRAME_EVERY * 4:
            raise BrokenChain(f"turn {number}: the delta chain does not end")
        base_number = current.get("base")
        if not isinstance(base_number, int) or isinstance(base_number, bool) or base_number >= current_number:
            raise BrokenChain(f"turn {current_number}: no valid base turn")
        chain.append(current.get("ops") or [])
        current_number = base_number
        if base_number not in rows:
            raise BrokenChain(f"turn {number}: base turn {base_number} is missing")
        current = rows[base_number]
    if not isinstance(current, list):
        raise BrokenChain(f"turn {current_number}: stored payload is not a list")
    payload: list[Any] = current
    for ops in reversed(chain):
        payload = apply(payload, ops)
    return payload
