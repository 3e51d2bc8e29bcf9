"""The C heap ONNX Runtime allocates from (glibc malloc): giving its free memory back to the OS after large runs
(``malloc_trim``), and whether malloc asks for transparent huge pages.

**Huge pages.** Without its memory arena ONNX Runtime allocates every large intermediate afresh on each run, and
the kernel faults a fresh buffer in 4 KiB at a time: on the 2-core development VM the fused weights graph at
(4, 12, 512, 64) spent about half its 96 ms there. glibc 2.35 and later advise ``MADV_HUGEPAGE`` on the memory
malloc maps when the tunable ``glibc.malloc.hugetlb=1`` is set at process start (``GLIBC_TUNABLES``), as numpy
already does for its own large arrays: a fault per 2 MiB, and freed memory still goes back to the OS
(``python -m bench onnx-options``; docs/benchmarks/kernels.md). ``python -m service serve`` starts itself with it
(``ATTN_MALLOC_HUGE_PAGES``, on by default): see :func:`huge_pages_environment`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Mapping
from typing import Any

TRIM_AFTER_BYTES = 64 << 20
"""After a run estimated to peak above this, the C heap's free memory is given back to the OS."""
HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb"
"""glibc's tunable (2.35 and later): ``1`` makes malloc advise transparent huge pages on the memory it maps."""
THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"
"""The kernel's transparent huge page mode: ``always``, ``madvise`` or ``never`` (the one in brackets)."""


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


def glibc_version() -> tuple[int, int] | None:
    """The glibc version of this process, or None without glibc (musl, macOS)."""
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION")  # "glibc 2.36"
    except (ValueError, OSError, AttributeError):
        return None
    if not text or not text.startswith("glibc "):
        return None
    try:
        major, minor = (int(part) for part in text.split()[1].split(".")[:2])
    except ValueError:
        return None
    return major, minor


def transparent_huge_pages(setting_file: str = THP_SETTING) -> str | None:
    """The kernel's transparent huge page mode (``always``, ``madvise``, ``never``), or None where it has none."""
    try:
        with open(setting_file) as f:
            text = f.read()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else None


def tunable_value(environ: Mapping[str, str], name: str = HUGE_PAGES_TUNABLE) -> str | None:
    """The value ``GLIBC_TUNABLES`` in ``environ`` gives tunable ``name`` (None when it names none)."""
    for item in environ.get("GLIBC_TUNABLES", "").split(":"):
        key, _, value = item.partition("=")
        if key == name:
            return value
    return None


def huge_pages_possible() -> bool:
    """Whether asking malloc for huge pages can work here: glibc 2.35 or later, and a kernel whose transparent huge
    pages are not ``never``.
    """
    version = glibc_version()
    return version is not None and version >= (2, 35) and transparent_huge_pages() in ("always", "madvise")


def malloc_huge_pages(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this process's malloc asks for transparent huge pages (the tunable set to 1 or 2 at its start)."""
    return tunable_value(environ) in ("1", "2") and huge_pages_possible()


def huge_pages_environment(environ: Mapping[str, str]) -> dict[str, str] | None:
    """``environ`` with ``glibc.malloc.hugetlb=1`` added to ``GLIBC_TUNABLES``, for a process to start with; None
    when it needs no change (it names the tunable already, whatever its value: an operator's choice stands) or the
    tunable cannot work here (:func:`huge_pages_possible`).
    """
    if tunable_value(environ) is not None or not huge_pages_possible():
        return None
    return with_tunable(environ, "1")


def with_tunable(environ: Mapping[str, str], value: str | None, name: str = HUGE_PAGES_TUNABLE) -> dict[str, str]:
    """``environ`` with tunable ``name`` in ``GLIBC_TUNABLES`` set to ``value`` (left out when None), the other
    tunables kept in their order.
    """
    kept = [t for t in environ.get("GLIBC_TUNABLES", "").split(":") if t and t.partition("=")[0] != name]
    return {**environ, "GLIBC_TUNABLES": ":".join(kept + ([] if value is None else [f"{name}={value}"]))}
