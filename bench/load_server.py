"""The server the load tests drive (``python -m bench load``, with or without ``--goodput``): the service started
as production runs it (``python -m service serve``, settings from the ``ATTN_*`` environment, a free port), and
its own counters from ``/metrics``.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from bench.ports import free_port
from bench.serving import SERVE, process

ONE_MIB = 1 << 20


@contextmanager
def served(env: dict[str, str], log: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``python -m service serve`` on a free port (gRPC on a free port too unless ``env`` says otherwise), ready;
    yields (process, url) and stops it with SIGTERM at the end (its exit code then in ``returncode``).
    """
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {"ATTN_GRPC_PORT": "0", **env, "ATTN_PORT": str(port)}
    with process(SERVE, url + "/readyz", log, env=env, timeout_s=120, grace_s=60) as server:
        yield server, url


def server_counters(url: str) -> dict[str, float]:
    """Rejections by reason, requests in flight and answers by status, from the server's /metrics."""
    out: dict[str, float] = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if m := re.match(r'attn_http_requests_rejected_total\{reason="(\w+)"\} (\S+)', line):
            out[f"rejected_{m.group(1)}"] = float(m.group(2))
        elif line.startswith("attn_http_requests_in_flight "):
            out["in_flight"] = float(line.split()[1])
        elif m := re.match(r"process_resident_memory_bytes (\S+)", line):
            out["process_resident_memory_mib"] = round(float(m.group(1)) / ONE_MIB, 1)
    return out
