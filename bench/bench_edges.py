"""The figures of issue 21 (Edges III), each against a server started the way production runs it.

    python -m bench edges connections [--holders 1000] [--nofile 1024] [--hold 15]   # item 7: open connections
    python -m bench edges upload-rss [--clients 64] [--mb 30]                        # item 8: peak RSS
    python -m bench edges json [--items 3000000]                                     # item 9: /healthz latency, RSS
    python -m bench edges route-labels [--paths 5000] [--kb 12]                      # item 10: RSS kept
    python -m bench edges idle-rss [--clients 8] [--mb 30]                           # item 14: idle RSS
    python -m bench edges all

Each command starts ``python -m service serve`` (numpy only unless ``--onnx``; settings from the ``ATTN_*``
environment, as in production, with the command's own on top), drives it with its own clients, prints what it
measured (JSON lines: one per measurement, then a summary), and stops it with SIGTERM. Linux only (reads /proc).
The issue's numbers were taken on a 2-core VM with the defaults (ATTN_MEMORY_BUDGET_BYTES 1 GiB).

- ``connections``: RLIMIT_NOFILE ``--nofile`` for the server; ``--holders`` connections each send ``POST /nope``
  with ``Content-Length: 1000000``, read the 404, send one byte and then nothing. Every 0.5 s for ``--hold`` s: the
  server's open descriptors and sockets (its connections: the holders it still keeps), and a /healthz on a new
  connection (status and time). Before the fix the holders stayed open and /healthz failed for the whole hold.
- ``upload-rss``: ``--clients`` concurrent valid /v2 attention requests of ``--mb`` MB each (binary float32,
  output only); the server's peak RSS (VmHWM) against its idle RSS and the memory budget; the answers by status.
- ``json``: ``{"query": [[], [], ... --items times], "key": [[1.0]], "value": [[1.0]]}`` (8.6 MB): its answer and
  time, the slowest /healthz during it (asked every 20 ms), and the RSS it left.
- ``route-labels``: ``--paths`` unauthenticated ``GET /x<i>aaaa...`` of ``--kb`` KB (under the 16 KiB header
  limit; the issue sent 60 KB, which is now a 431): RSS before and after.
- ``idle-rss``: ``--clients`` concurrent ``--mb`` MB /v2 uploads refused on their estimate (413), then the same
  number answered 200; the RSS 3 s after each round, against the RSS before.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import socket
import tempfile
import threading
import time
from argparse import Namespace
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

from bench.ports import free_port
from bench.serving import SERVE, process, rss_bytes
from bench.suite import Parser

MB = 1_000_000


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


class Server:
    """``python -m service serve`` on a free port with these settings (:func:`bench.serving.process`); stopped with
    SIGTERM (:meth:`stop`).
    """

    def __init__(self, env: dict[str, str], *, onnx: bool = False, nofile: int | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        base = {k: v for k, v in os.environ.items() if not k.startswith("PROMETHEUS_")}
        full = {"ATTN_PORT": str(self.port), "ATTN_GRPC_ENABLED": "false", "ATTN_LOG_LEVEL": "warning"}
        full["ATTN_ENABLE_ONNX"] = base.get("ATTN_ENABLE_ONNX", "true" if onnx else "false")
        full.update(env)

        def limits() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self._stack = contextlib.ExitStack()
        try:
            log = Path(self._stack.enter_context(tempfile.TemporaryDirectory())) / "server.log"
            self.proc = self._stack.enter_context(
                process(
                    SERVE,
                    self.url + "/readyz",
                    log,
                    env=full,
                    base_env=base,
                    timeout_s=120,
                    grace_s=60,
                    preexec_fn=limits if nofile is not None else None,
                )
            )
        except BaseException:
            self._stack.close()
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    def rss_mb(self, field: str = "VmRSS") -> float:
        return rss_bytes(self.pid, field) / (1 << 20)

    def stop(self) -> None:
        self._stack.close()


def binary_infer(shape: tuple[int, ...], outputs: tuple[str, ...] = ("output",)) -> tuple[bytes, dict[str, str]]:
    """A /v2 attention request with query, key and value of ``shape``, binary float32."""
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(shape).astype("<f4") for _ in range(3)]
    header = orjson.dumps(
        {
            "inputs": [
                {"name": n, "shape": list(shape), "datatype": "FP32", "parameters": {"binary_data_size": a.nbytes}}
                for n, a in zip(("query", "key", "value"), arrays, strict=True)
            ],
            "outputs": [{"name": n, "parameters": {"binary_data": True}} for n in outputs],
            "parameters": {"diagnostics": False},
        }
    )
    headers = {"inference-header-content-length": str(len(header)), "content-type": "application/octet-stream"}
    return header + b"".join(a.tobytes() for a in arrays), headers


def shape_for(megabytes: float, rows: int) -> tuple[int, ...]:
    """(1, 16, rows, E): three float32 tensors of about ``megabytes`` MB in all."""
    e = max(1, int(megabytes * MB / 3 / 4 / 16 / rows))
    return (1, 16, rows, e)


async def post_many(url: str, body: bytes, headers: dict[str, str], n: int) -> Counter[str]:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(limits=limits, timeout=300) as client:

        async def one() -> str:
            try:
                return str((await client.post(url, content=body, headers=headers)).status_code)
            except httpx.TransportError as exc:
                return type(exc).__name__

        return Counter(await asyncio.gather(*(one() for _ in range(n))))


# -------------------------------------------------------------------------------------------------- commands


def connections(args: Namespace) -> None:
    server = Server({}, nofile=args.nofile)
    holders: list[socket.socket] = []
    head = b"POST /nope HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\ncontent-length: 1000000\r\n\r\n"
    refused = 0
    for _ in range(args.holders):
        try:
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            sock.sendall(head)
            sock.recv(65536)
            sock.sendall(b"x")
            holders.append(sock)
        except OSError:
            refused += 1
    emit(command="connections", holders=len(holders), failed_to_hold=refused, nofile=args.nofile)
    t0 = time.monotonic()
    worst_open = 0
    while time.monotonic() - t0 < args.hold:
        fds = sockets = 0
        for fd in os.listdir(f"/proc/{server.pid}/fd"):
            fds += 1
            with contextlib.suppress(OSError):  # a descriptor closed meanwhile
                sockets += os.readlink(f"/proc/{server.pid}/fd/{fd}").startswith("socket:")
        h0 = time.monotonic()
        try:
            status: Any = httpx.get(server.url + "/healthz", timeout=2).status_code
        except httpx.TransportError as exc:
            status = type(exc).__name__
        worst_open = max(worst_open, sockets)
        emit(
            t_s=round(time.monotonic() - t0, 1),
            server_fds=fds,
            server_sockets=sockets,  # the listening socket, the probes' and the holders' connections
            healthz=status,
            healthz_ms=round((time.monotonic() - h0) * 1e3, 1),
        )
        time.sleep(0.5)
    emit(command="connections", most_server_sockets=worst_open)
    for sock in holders:
        sock.close()
    server.stop()


def upload_rss(args: Namespace) -> None:
    server = Server({})
    body, headers = binary_infer(shape_for(args.mb, 1024))
    idle = server.rss_mb()
    counts = asyncio.run(post_many(server.url + "/v2/models/attention/infer", body, headers, args.clients))
    peak = server.rss_mb("VmHWM")
    emit(
        command="upload-rss",
        clients=args.clients,
        body_mb=round(len(body) / MB, 1),
        idle_rss_mb=round(idle),
        peak_rss_mb=round(peak),
        peak_above_idle_mb=round(peak - idle),
        memory_budget_mb=1024,
        answers=dict(counts),
    )
    server.stop()


def json_pathological(args: Namespace) -> None:
    server = Server({})
    body = b'{"query": [' + b"[]," * (args.items - 1) + b'[]], "key": [[1.0]], "value": [[1.0]]}'
    before = server.rss_mb()
    stop = threading.Event()
    slowest = [0.0]

    def probe() -> None:
        with httpx.Client(timeout=30) as c:
            while not stop.is_set():
                t0 = time.monotonic()
                c.get(server.url + "/healthz")
                slowest[0] = max(slowest[0], time.monotonic() - t0)
                time.sleep(0.02)

    prober = threading.Thread(target=probe)
    prober.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    r = httpx.post(server.url + "/v1/attention", content=body, headers={"content-type": "application/json"}, timeout=60)
    took = time.monotonic() - t0
    time.sleep(0.3)
    stop.set()
    prober.join()
    emit(
        command="json",
        body_mb=round(len(body) / MB, 1),
        status=r.status_code,
        detail=r.json().get("detail", "")[:120],
        answer_s=round(took, 3),
        slowest_healthz_ms=round(slowest[0] * 1e3, 1),
        rss_before_mb=round(before),
        rss_after_mb=round(server.rss_mb()),
        peak_rss_mb=round(server.rss_mb("VmHWM")),
    )
    server.stop()


def route_labels(args: Namespace) -> None:
    server = Server({"ATTN_API_KEYS": "k" * 32})
    filler = "a" * (args.kb * 1000)
    with httpx.Client(base_url=server.url, timeout=10) as c:
        for i in range(200):
            c.get(f"/w{i}")
        before = server.rss_mb()
        statuses: Counter[int] = Counter()
        for i in range(args.paths):
            statuses[c.get(f"/x{i}{filler}").status_code] += 1
        after = server.rss_mb()
    emit(
        command="route-labels",
        paths=args.paths,
        path_kb=args.kb,
        rss_before_mb=round(before, 1),
        rss_after_mb=round(after, 1),
        kept_mb=round(after - before, 1),
        answers=dict(statuses),
    )
    server.stop()


def idle_rss(args: Namespace) -> None:
    server = Server({})
    refused, refused_headers = binary_infer(shape_for(args.mb, 10_000), outputs=("output", "weights"))  # 413
    answered, answered_headers = binary_infer(shape_for(args.mb, 1024))
    httpx.get(server.url + "/healthz")
    idle = server.rss_mb()
    for label, body, headers in (("refused", refused, refused_headers), ("answered", answered, answered_headers)):
        counts = asyncio.run(post_many(server.url + "/v2/models/attention/infer", body, headers, args.clients))
        time.sleep(3)
        emit(
            command="idle-rss",
            round=label,
            clients=args.clients,
            body_mb=round(len(body) / MB, 1),
            idle_before_mb=round(idle),
            idle_after_mb=round(server.rss_mb()),
            answers=dict(counts),
        )
    server.stop()


COMMANDS = {
    "connections": connections,
    "upload-rss": upload_rss,
    "json": json_pathological,
    "route-labels": route_labels,
    "idle-rss": idle_rss,
}


def arguments() -> Parser:
    quick = {"holders": 20, "hold": 1.0, "clients": 2, "mb": 1.0, "items": 30_000, "paths": 50, "kb": 1}
    parser = Parser(__name__, __doc__, quick=quick)
    parser.add_argument("command", choices=[*COMMANDS, "all"])
    parser.add_argument("--holders", type=int, default=1000, help="connections: holders (default 1000)")
    parser.add_argument("--nofile", type=int, default=1024, help="connections: the server's RLIMIT_NOFILE")
    parser.add_argument("--hold", type=float, default=15.0, help="connections: seconds watched (default 15)")
    parser.add_clients(None, "upload-rss, idle-rss: concurrent uploads (default 64 and 8)")
    parser.add_argument("--mb", type=float, default=30.0, help="upload-rss, idle-rss: MB per upload (default 30)")
    parser.add_argument("--items", type=int, default=3_000_000, help="json: empty lists in the query (default 3e6)")
    parser.add_argument("--paths", type=int, default=5000, help="route-labels: paths (default 5000)")
    parser.add_argument("--kb", type=int, default=12, help="route-labels: KB per path (default 12)")
    return parser


def main(argv: list[str]) -> int:
    args = arguments().parse(argv)
    given = args.clients
    for name in COMMANDS if args.command == "all" else [args.command]:
        args.clients = given if given is not None else {"upload-rss": 64, "idle-rss": 8}.get(name, 8)
        COMMANDS[name](args)
    return 0
