"""Setting up prometheus-client's multiprocess mode before anything imports prometheus-client.

Kept free of that import on purpose: the mode is fixed when prometheus-client
is first imported, so ``python -m service serve`` calls this first.
"""

from __future__ import annotations

import os
from pathlib import Path


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
