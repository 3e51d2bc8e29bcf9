"""The server the load tests drive (``python -m bench load``, with or without ``--goodput``): the service started
as production runs it (``python -m service serve``, settings from the ``ATTN_*`` environment, a free port), its
resident memory read from ``/proc`` and its own counters from ``/metrics``.
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


def rss_bytes(pid: int, field: str = "VmRSS") -> int:
    """The server's resident memory now (``VmRSS``), or its peak so far (``VmHWM``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} for pid {pid}")


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
