"""Paths inside a workspace: the one check for every path the engine takes from state or files.

A session's state, its journal and an imported bundle are all data a client
could have written, so a path found in them is a claim to check, never a
place to open: it must be relative, must not climb out with ``..`` and, once
symlinks are followed, must still land inside the workspace.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from contextlab.engine.core.errors import MalformedInput


class UnsafePath(MalformedInput, ValueError):
    """A path that is absolute, climbs out of its root, or leads outside it through a symlink.

    Also a ValueError, which is what callers of ``OffloadStore.resolve`` caught before.
    """


def relative_parts(relative: str, *, field: str = "path") -> PurePosixPath:
    """``relative`` as a clean relative POSIX path; UnsafePath when it is not one.

    Only the shape is checked here (no file system access), so it also serves
    names that do not exist yet, such as the members of an uploaded zip.
    """
    if not isinstance(relative, str) or not relative:
        raise UnsafePath("a workspace path must be a non-empty string", field=field)
    if "\x00" in relative or "\\" in relative:
        raise UnsafePath(f"{relative!r} is not a workspace path", field=field)
    pure = PurePosixPath(relative)
    # PurePosixPath drops "." parts and repeated slashes, so "a/./b" and "a//b" are fine.
    if pure.is_absolute() or not pure.parts or ".." in pure.parts:
        raise UnsafePath(f"{relative!r} points outside the workspace", field=field)
    return pure


def workspace_path(root: Path, relative: str, *, field: str = "path") -> Path:
    """The path of ``relative`` under ``root``, checked to stay inside ``root`` with symlinks followed."""
    pure = relative_parts(relative, field=field)
    base = root.resolve()
    candidate = (base / pure).resolve()
    if candidate == base or not candidate.is_relative_to(base):
        raise UnsafePath(f"{relative!r} points outside the workspace", field=field)
    return candidate


def is_inside(root: Path, relative: str) -> bool:
    """True when ``workspace_path`` would accept ``relative``."""
    try:
        workspace_path(root, relative)
    except UnsafePath:
        return False
    return True
