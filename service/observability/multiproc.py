"""Setting up prometheus-client's multiprocess mode before anything imports prometheus-client.

Kept free of that import on purpose: the mode is fixed when prometheus-client
is first imported, so ``python -m service serve`` calls this first.

The workers' metrics live in memory-mapped files in ``ATTN_METRICS_DIR``. A file that grows on a full
filesystem (a small tmpfs) cannot be backed, and the worker dies of SIGBUS on its next write, without a
log line; uvicorn replaces it, and the replacement dies too. So the directory's free space is checked
before the workers start (:func:`check_metrics_room`: ``serve`` refuses to start) and again by each
worker as it starts (:class:`~service.observability.metrics.ServiceMetrics`: the worker fails to start,
with the reason).
"""

from __future__ import annotations

import os
from pathlib import Path

METRICS_BYTES_PER_WORKER = 4 << 20
"""Room one worker's files need: four files (counters, histograms, two kinds of live gauges) of 64 KiB that
double as series are added (a busy worker's reach 256 KiB to 1 MiB), with room to grow."""


class MetricsDirError(RuntimeError):
    """The metrics directory cannot hold the workers' files."""


def free_bytes(directory: Path) -> int:
    """Bytes an unprivileged process may still write in ``directory``'s filesystem."""
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


def check_metrics_room(directory: Path, workers: int, spare: int = 1) -> None:
    """Raise :class:`MetricsDirError` unless ``directory`` has room for ``workers`` workers' files and ``spare``
    replacements' (a worker that died leaves its counters and histograms behind).
    """
    need = (workers + spare) * METRICS_BYTES_PER_WORKER
    free = free_bytes(directory)
    if free < need:
        raise MetricsDirError(
            f"ATTN_METRICS_DIR {directory} has {free / 2**20:.2f} MiB free; {workers} worker(s) need at least "
            f"{need / 2**20:.0f} MiB ({METRICS_BYTES_PER_WORKER >> 20} MiB each, replacements included): a worker "
            "whose metrics file cannot grow dies of SIGBUS. Give the directory more room (a tmpfs or emptyDir of "
            "64 MiB is plenty)"
        )


def prepare_metrics_dir(metrics_dir: Path | None) -> Path | None:
    """Point ``PROMETHEUS_MULTIPROC_DIR`` at ``metrics_dir`` (or keep the one already set), create
    it and delete the files of earlier runs, whose counters would otherwise be added to this one's.
    Returns the directory, or None when metrics stay in-process (one worker, no directory).
    """
    chosen = metrics_dir or (
        Path(os.environ["PROMETHEUS_MULTIPROC_DIR"]) if os.environ.get("PROMETHEUS_MULTIPROC_DIR") else None
    )
    if chosen is None:
        return None
    chosen.mkdir(parents=True, exist_ok=True)
    for stale in chosen.glob("*.db"):
        stale.unlink()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(chosen)
    return chosen
