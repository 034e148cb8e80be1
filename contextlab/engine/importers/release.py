"""Give the memory an import used back to the system once it is done.

Freed Python objects go back to CPython's allocator and to the C library's
heap, which keeps them for later: after a large import the process stays as big
as the import's peak, so a few imports in turn keep a server at its worst size.
A full collection frees what only cycles hold, and glibc's ``malloc_trim``
returns the heap's free pages. Other C libraries have no such call (and return
memory on their own), so it is only looked up, never assumed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import platform
from collections.abc import Callable
from functools import cache


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def release_memory() -> bool:
    """Collect garbage and hand free heap pages back; True when the C library could be asked to."""
    gc.collect()
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
