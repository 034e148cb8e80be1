"""The external store: externalized and summarized units, byte for byte.

``<workspace>/externalized/<key>.json`` holds the original messages of one
evicted unit in their lossless JSON form (``Message.to_dict``), plus what the
unit was. The key is a content hash (of the unit ids and the messages), so
storing the same unit twice writes one file, and a key names exactly one
content forever. Files are written atomically (temp file, then rename): a
placeholder never points to a half-written file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from contextlab.engine.core.messages import Message
from contextlab.engine.memory.retrieval import (
    EXTERNALIZED_DIR,
    Document,
    Hit,
    message_search_text,
    rank_documents,
)
from contextlab.engine.policies.eviction.units import InformationUnit

KEY_LENGTH = 20
_KEY = re.compile(r"^[0-9a-f]{8,64}$")


def _json(data: Any) -> str:
    # default=str: metadata from importers is JSON already; anything else is
    # recorded as text rather than failing the eviction.
    return json.dumps(data, ensure_ascii=False, default=str)


class ExternalStore:
    def __init__(self, workspace: str | Path) -> None:
        self.workspace = Path(workspace)
        self.folder = self.workspace / EXTERNALIZED_DIR

    @staticmethod
    def relative(key: str) -> str:
        return f"{EXTERNALIZED_DIR}/{key}.json"

    def path_for(self, key: str) -> Path:
        # Keys are hex digests: anything else could name a file outside the folder.
        if not _KEY.match(key):
            raise KeyError(f"{key!r} is not an externalized-unit key")
        return self.folder / f"{key}.json"

    def put(self, unit: InformationUnit | Sequence[InformationUnit], messages: Sequence[Message]) -> str:
        """Store ``messages`` (the unit's original messages); returns the key."""
        units = [unit] if isinstance(unit, InformationUnit) else list(unit)
        dicts = [m.to_dict() for m in messages]
        body = _json({"units": [u.id for u in units], "messages": dicts})
        key = hashlib.sha256(body.encode("utf-8")).hexdigest()[:KEY_LENGTH]
        target = self.path_for(key)
        if not target.exists():
            self.folder.mkdir(parents=True, exist_ok=True)
            record = {
                "key": key,
                "units": [{"id": u.id, "type": u.type, "label": u.label, "tokens": u.tokens,
                           "message_ids": list(u.message_ids)} for u in units],
                "message_ids": [m.id for m in messages],
                "messages": dicts,
            }
            tmp = target.with_suffix(".tmp")
            tmp.write_text(_json(record), encoding="utf-8")
            os.replace(tmp, target)
        return key

    def entry(self, key: str) -> dict[str, Any]:
        path = self.path_for(key)
        if not path.is_file():
            raise KeyError(f"no externalized unit {key!r} in {self.folder}")
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return data

    def get(self, key: str) -> list[Message]:
        """The stored messages, equal to the originals (``Message.__eq__`` and ``to_dict``)."""
        return [Message.from_dict(d) for d in self.entry(key)["messages"]]

    def list_keys(self) -> list[str]:
        if not self.folder.is_dir():
            return []
        return sorted(p.stem for p in self.folder.glob("*.json") if _KEY.match(p.stem))

    def search(self, query: str, *, limit: int = 10) -> list[Hit]:
        """Rank the stored messages of this store against ``query``."""
        docs: list[Document] = []
        for key in self.list_keys():
            for data in self.entry(key).get("messages") or []:
                docs.append(Document("externalized", self.relative(key), str(data.get("id")),
                                     message_search_text(data)))
        return rank_documents(docs, query, limit=limit)


def recall(workspace: str | Path, key: str) -> list[Message]:
    """The original messages of an externalized unit (what a placeholder's ``recall`` names)."""
    return ExternalStore(workspace).get(key)
