"""The server the load tests drive (``python -m bench load``, with or without ``--goodput``): the service started
as production runs it (``python -m service serve``, settings from the ``ATTN_*`` environment, a free port), its
resident memory read from ``/proc`` and its own counters from ``/metrics``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from bench.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
ONE_MIB = 1 << 20


def start_server(env: dict[str, str], log_path: Path) -> tuple[subprocess.Popen[bytes], str, Any]:
    """``python -m service serve`` on a free port, ready; returns (process, url, log file)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(log_path, "wb")  # noqa: SIM115 -- closed by the caller with the server
    server = subprocess.Popen(
        [sys.executable, "-m", "service", "serve"],
        cwd=ROOT,
        env={**os.environ, "ATTN_GRPC_PORT": "0", **env, "ATTN_PORT": str(port)},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return server, url, log
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or server.poll() is not None:
            server.kill()
            raise RuntimeError(f"server not ready; see {log_path}")
        time.sleep(0.2)


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
