"""Tail latency of tiny requests with and without the frozen start-up heap (``ATTN_GC_FREEZE``), in one run.

    python -m bench tail [--duration 15] [--rounds 3]

Needs wrk (as ``python -m bench http``). Starts the service twice the way
production runs it (``python -m service serve``), one with ``ATTN_GC_FREEZE``
true (the default) and one with it false, and sends each, in alternating
rounds, one client's stream of (1, 1, 4, 4) ``/v2`` JSON requests with
diagnostics (``bench/http_post.lua``, one connection). A full collection of
the unfrozen heap pauses the event loop for ~20 ms, which only the highest
percentiles show: the table gives p50, p99, p99.9 and the maximum of each
round, and the ratios of the two servers' p99.9 and maxima (medians of the
rounds). Each server's own ``python_gc_collections_total`` (``/metrics``),
read before and after the rounds, gives its garbage collections per 1,000
requests.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.bench_http import load, send, server, versions, wrk
from bench.http_cases import SMALL, v2_body
from bench.ports import free_port
from bench.suite import Parser


def gc_collections(url: str) -> dict[str, float]:
    """The server's garbage collections so far, by generation ("0", "1", "2"), from its /metrics."""
    status, text, _ = send("GET", f"{url}/metrics", b"", {})
    if status != 200:
        raise SystemExit(f"{url}/metrics: {status}")
    counts = {}
    for line in text.decode().splitlines():
        if line.startswith('python_gc_collections_total{generation="'):
            counts[line.split('"')[1]] = float(line.rsplit(" ", 1)[1])
    return counts


VARIANTS = {"frozen (ATTN_GC_FREEZE=true)": "true", "not frozen (ATTN_GC_FREEZE=false)": "false"}
PATH = "/v2/models/attention/infer"


def arguments() -> Parser:
    parser = Parser(__name__, __doc__, quick={"duration": 1.0, "rounds": 1, "warmup": 1.0})
    parser.add_duration(15.0, "seconds of wrk per round and server")
    parser.add_rounds(3, "rounds, alternating the two servers")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of wrk per server first (default 2)")
    return parser


def main(argv: list[str]) -> int:
    args = arguments().parse(argv)
    if shutil.which("wrk") is None:
        print(
            "wrk is not installed: `apt-get install -y wrk` (Debian/Ubuntu) or `brew install wrk` (macOS)",
            file=sys.stderr,
        )
        return 2
    body, headers = v2_body(SMALL, False)
    load_start = load()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        body_file = tmpdir / "body"
        body_file.write_bytes(body)
        ports = {name: free_port() for name in VARIANTS}
        cmd = [sys.executable, "-m", "service", "serve", "--host", "127.0.0.1", "--port"]
        with ExitStack() as servers:
            for i, (name, freeze) in enumerate(VARIANTS.items()):
                url = f"http://127.0.0.1:{ports[name]}"
                log = tmpdir / f"server{i}.log"
                servers.enter_context(
                    server([*cmd, str(ports[name])], f"{url}/readyz", log, env={"ATTN_GC_FREEZE": freeze})
                )
            for port in ports.values():  # warm-up
                wrk("POST", f"http://127.0.0.1:{port}{PATH}", body_file, headers, 1, args.warmup)
            before = {name: gc_collections(f"http://127.0.0.1:{port}") for name, port in ports.items()}
            for r in range(args.rounds):
                for name, port in ports.items():
                    result = wrk("POST", f"http://127.0.0.1:{port}{PATH}", body_file, headers, 1, args.duration)
                    if result["non_2xx"] or result["socket_errors"]:
                        raise SystemExit(f"{name}: {result}")
                    runs[name].append(result)
                    print(f"  round {r + 1} {name}: {result}", file=sys.stderr)
            after = {name: gc_collections(f"http://127.0.0.1:{port}") for name, port in ports.items()}
    print(f"### Tail latency ({round(args.duration)} s x {args.rounds})\n")
    print(*versions(), sep="\n")
    print(f"- load average (1, 5, 15 min) at start: {load_start}; at end: {load()}\n")
    print("| server | round | requests | p50 ms | p99 ms | p99.9 ms | max ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, results in runs.items():
        for i, x in enumerate(results, 1):
            print(
                f"| {name} | {i} | {x['requests']} | {x['p50_us'] / 1e3:.2f} | {x['p99_us'] / 1e3:.2f} "
                f"| {x['p999_us'] / 1e3:.2f} | {x['max_us'] / 1e3:.2f} |"
            )
    print("\n| server | requests | gen-0 collections per 1,000 requests | gen-1 | gen-2 |")
    print("|---|---:|---:|---:|---:|")
    for name, results in runs.items():
        n = sum(x["requests"] for x in results)
        per = {g: (after[name][g] - before[name][g]) * 1000 / n for g in ("0", "1", "2")}
        print(f"| {name} | {n} | {per['0']:.2f} | {per['1']:.3f} | {per['2']:.4f} |")
    frozen, thawed = (runs[name] for name in VARIANTS)
    print()
    for key, label in (("p50_us", "p50"), ("p999_us", "p99.9"), ("max_us", "max")):
        a = statistics.median(x[key] for x in thawed) / 1e3
        f = statistics.median(x[key] for x in frozen) / 1e3
        print(f"- {label} (median of rounds): not frozen {a:.2f} ms / frozen {f:.2f} ms = {a / f:.2f}x")
    return 0
