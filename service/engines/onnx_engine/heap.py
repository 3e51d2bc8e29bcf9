"""Giving the C heap's free memory back to the OS after large runs (glibc ``malloc_trim``)."""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

TRIM_AFTER_BYTES = 64 << 20
"""After a run estimated to peak above this, the C heap's free memory is given back to the OS."""


def _malloc_trim() -> Any:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc
        return None


_MALLOC_TRIM = _malloc_trim()


def release_free_heap() -> None:
    """Return free C-heap memory to the OS (glibc ``malloc_trim(0)``; a no-op without glibc).

    With ONNX Runtime's arena off, intermediates above glibc's mmap threshold go back to the OS when
    freed, but smaller ones (up to 32 MiB once the threshold has adapted) stay in the heap, so a
    large request would leave the process at its peak: after such a run the free heap is trimmed.
    """
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
