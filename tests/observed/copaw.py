"""The shared CoPaw 1.0.2 run, zipped the ways a user uploads it."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.corpus import COPAW_RUN

WORKSPACE = COPAW_RUN / "workspace-sample"
REQUESTS = COPAW_RUN / "requests"


def require_sample() -> None:
    if not WORKSPACE.is_dir() or not REQUESTS.is_dir():
        pytest.skip(f"the CoPaw sample is missing at {COPAW_RUN}")


def analysis() -> dict[str, Any]:
    require_sample()
    return json.loads((COPAW_RUN / "analysis.json").read_text(encoding="utf-8"))


def zip_of(target: Path, *, workspace: bool = True, requests: bool = True) -> Path:
    """``default/…`` for the workspace and ``requests/NNNN.json`` beside it, as a user would zip them."""
    require_sample()
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        if workspace:
            for path in sorted(WORKSPACE.rglob("*")):
                if path.is_file():
                    archive.write(path, f"default/{path.relative_to(WORKSPACE).as_posix()}")
        if requests:
            for path in sorted(REQUESTS.glob("*.json")):
                archive.write(path, f"requests/{path.name}")
    return target


def recorded_requests() -> list[dict[str, Any]]:
    require_sample()
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(REQUESTS.glob("*.json"))]
