"""The servers the benchmarks start: a command in a process of its own, yielded once a URL answers 200, stopped
with SIGTERM when the benchmark is done (killed when it outlives its grace); the service itself on free ports,
started as production runs it (``python -m service serve``); and a server's resident memory, read from ``/proc``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
SERVE = [sys.executable, "-m", "service", "serve"]
"""The service as production starts it: uvicorn with REST and, in the same process, gRPC."""


@contextmanager
def process(
    cmd: list[str],
    ready_url: str,
    log: Path,
    *,
    env: Mapping[str, str] | None = None,
    base_env: Mapping[str, str] | None = None,
    root: Path = ROOT,
    timeout_s: float = 300.0,
    grace_s: float = 30.0,
    preexec_fn: Callable[[], None] | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """``cmd`` run from ``root`` with ``env`` over ``base_env`` (this process's environment by default) and
    ``preexec_fn`` run in the child before it starts (resource limits), its output in ``log``; yielded once
    ``ready_url`` answers 200 (``SystemExit`` with the log's tail when it exits first or is not ready within
    ``timeout_s``); at the end stopped with SIGTERM, and killed if it has not exited ``grace_s`` later. Its exit
    code is then ``returncode``.
    """
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=root, env={**os.environ, **(env or {})}, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                if proc.poll() is not None:
                    raise SystemExit(f"{' '.join(cmd)} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
                try:
                    with urllib.request.urlopen(ready_url, timeout=2) as r:
                        if r.status == 200:
                            break
                except (urllib.error.URLError, ConnectionError, TimeoutError):
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit(f"{ready_url} not ready after {timeout_s:g} s:\n{log.read_text()[-3000:]}")
                time.sleep(0.1)
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@dataclass(frozen=True)
class Served:
    """The service, running: its REST and gRPC ``host:port`` and its process."""

    rest: str
    grpc: str
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://{self.rest}"


@contextmanager
def service(
    log: Path,
    settings: Mapping[str, str] | None = None,
    root: Path = ROOT,
    *,
    timeout_s: float = 300.0,
    grace_s: float = 30.0,
) -> Iterator[Served]:
    """The service on free ports (with ``settings``, ATTN_* variables, if given, over this process's environment;
    from the checkout ``root``, this one by default, its package first on the path: an editable install points at
    this one), once ready; stopped as :func:`process` stops it. ``ATTN_LOG_LEVEL=warning`` unless ``settings`` says
    otherwise: no access line per request.
    """
    port, grpc_port = free_port(), free_port()
    env = {"ATTN_PORT": str(port), "ATTN_GRPC_PORT": str(grpc_port), "ATTN_LOG_LEVEL": "warning", **(settings or {})}
    env["PYTHONPATH"] = str(root)
    ready = f"http://127.0.0.1:{port}/readyz"
    with process(SERVE, ready, log, env=env, root=root, timeout_s=timeout_s, grace_s=grace_s) as proc:
        yield Served(f"127.0.0.1:{port}", f"127.0.0.1:{grpc_port}", proc)


def rss_bytes(pid: int, field: str = "VmRSS") -> int:
    """A process's resident memory (Linux) now (``VmRSS``), or its peak so far (``VmHWM``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} for pid {pid}")
