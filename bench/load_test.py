"""Load test (issues 5, 27): 60 s of REST and gRPC at 64 clients each, valid and invalid mixed; goodput (issue 8).

    python -m bench load [--duration 60] [--concurrency 64] [--warmup 10] [--json out.json]
    python -m bench load --no-grpc [--grpc-clients 64]
    python -m bench load --goodput [--goodput-duration 15]

``--goodput`` measures the goodput table instead (:mod:`bench.load_goodput`).

Needs wrk (Debian/Ubuntu: ``apt-get install -y wrk``). The run starts the
service the way production runs it (:func:`bench.serving.service`: ``python -m service serve``, settings from
the ``ATTN_*`` environment; ``ATTN_MAX_BODY_BYTES`` defaults to 1 MiB here so
that an oversized request is 1.5 MiB of loopback traffic, not 48 MiB), drives
it with wrk and ``bench/load_mix.lua`` (64 connections, 2 threads, 60 s client
timeout) and, at the same time, over gRPC on a free port (``ATTN_GRPC_PORT``)
with ``bench/load_grpc.py`` (a process of its own: 64 grpc.aio clients on 8
connections, 60 s deadlines; ``--no-grpc``: REST alone), both through the
warm-up and the measured run, and stops it with SIGTERM.

Request mix (weights): /v1/attention with nested JSON (2, 16, 16) (30), with
base64 (1, 4, 64, 32) (15), /v1/softmax (8, 64) (15); invalid bodies:
malformed JSON, shapes that disagree, an unknown field, a wrong type (30);
oversized bodies (10). Every request carries ``X-Request-ID: <kind>-<n>``; the
server echoes it, so each answer is tallied under its kind. gRPC mix (see
``bench/load_grpc.py``): ModelInfer attention (1, 2, 16, 16) and softmax (8, 64)
with raw tensors (60); a wrong input name, a shape that disagrees with the raw
size, an unknown model, undecodable bytes (40); ``x-request-id: <kind>-<n>``.

Reports: requests answered, by status and by kind; latency p50/p90/p99/max
(wrk, all answers); wrk's socket errors (a request without an answer); the
server's resident memory (VmRSS) after start-up, after the warm-up and at the
end (these two read 2 s after the load stopped: the server gives its free C heap
back once quiet for a second), and its peak under load (VmHWM) against the
memory budget (``ATTN_MEMORY_BUDGET_BYTES``, 1 GiB by default) plus 400 MiB; the
gRPC calls by status code and by kind, their latency percentiles, and how many
RESOURCE_EXHAUSTED/UNAVAILABLE answers carried ``retry-after``; the server's own
counters. Exits 1 when one of the issues' expectations fails: no 5xx other
than 503, no request lost, final RSS within 10% of the post-warm-up RSS, peak
RSS within the budget + 400 MiB; over gRPC, no status but OK, INVALID_ARGUMENT,
NOT_FOUND, RESOURCE_EXHAUSTED and UNAVAILABLE, the last two with ``retry-after``.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from argparse import BooleanOptionalAction
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.load_goodput import goodput
from bench.machine import machine
from bench.ports import free_port
from bench.serving import rss_bytes, service
from bench.suite import Parser

ROOT = Path(__file__).resolve().parents[1]
LUA = ROOT / "bench" / "load_mix.lua"
ONE_MIB = 1 << 20
GRPC_DRIVER = "bench.load_grpc"  # run as python -m, from the repository's root
GRPC_ALLOWED = ("OK", "INVALID_ARGUMENT", "NOT_FOUND", "RESOURCE_EXHAUSTED", "UNAVAILABLE")
RSS_HEADROOM = 400 << 20  # peak RSS may exceed the memory budget by this much (the interpreter, gRPC, buffers)


def _tensor_b64(arr: np.ndarray) -> dict[str, Any]:
    return {"shape": list(arr.shape), "dtype": "float32", "b64": base64.b64encode(arr.astype("<f4").tobytes()).decode()}


def build_requests(max_body_bytes: int) -> dict[str, tuple[str, bytes, int]]:
    """Kind -> (path, body, weight)."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 16, 16)).round(4).tolist() for _ in range(3))
    qb, kb, vb = (rng.standard_normal((1, 4, 64, 32), dtype=np.float32) for _ in range(3))
    dump = lambda obj: json.dumps(obj).encode()  # noqa: E731 -- a one-line local helper
    return {
        "valid_attention_json": ("/v1/attention", dump({"query": q, "key": k, "value": v, "causal": True}), 30),
        "valid_attention_b64": (
            "/v1/attention",
            dump(
                {
                    "query": _tensor_b64(qb),
                    "key": _tensor_b64(kb),
                    "value": _tensor_b64(vb),
                    "return": ["output"],
                    "encoding": "base64",
                }
            ),
            15,
        ),
        "valid_softmax": (
            "/v1/softmax",
            dump({"logits": rng.standard_normal((8, 64)).round(4).tolist(), "log": True}),
            15,
        ),
        "invalid_json": ("/v1/attention", b'{"query": [[1, 2], ', 8),
        "invalid_shapes": (
            "/v1/attention",
            dump({"query": [[1.0, 2.0]], "key": [[1.0, 2.0, 3.0]], "value": [[1.0]]}),
            8,
        ),
        "invalid_field": ("/v1/softmax", dump({"logits": [1.0, 2.0], "temprature": 2}), 7),
        "invalid_type": ("/v1/softmax", dump({"logits": "one, two"}), 7),
        "oversized": ("/v1/softmax", b'{"logits": [' + b"0.125, " * (int(max_body_bytes * 1.5) // 7) + b"0.5]}", 10),
    }


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


def run_wrk(url: str, args: list[str], concurrency: int, seconds: float) -> dict[str, Any]:
    cmd = ["wrk", "-t2", f"-c{concurrency}", f"-d{seconds:g}s", "--timeout", "60s", "-s", str(LUA), url, "--", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("LOAD ")), None)
    if line is None:
        raise RuntimeError(f"wrk failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return json.loads(line[5:])


def start_grpc_load(target: str, clients: int, seconds: float, out: Path) -> subprocess.Popen[str]:
    """``bench/load_grpc.py`` against ``target``, returned once its channels are connected (its clock running)."""
    cmd = [sys.executable, "-m", GRPC_DRIVER, "--target", target, "--clients", str(clients)]
    proc = subprocess.Popen(
        [*cmd, "--duration", f"{seconds:g}", "--json", str(out)], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        raise RuntimeError(f"the gRPC load driver did not start (exit {proc.wait()})")
    return proc


def finish_grpc_load(proc: subprocess.Popen[str], out: Path, seconds: float) -> dict[str, Any]:
    """Wait for the driver (its calls have 60 s deadlines); its report."""
    proc.communicate(timeout=seconds + 120)
    if proc.returncode != 0:
        raise RuntimeError(f"the gRPC load driver failed ({proc.returncode})")
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def grpc_checks(runs: list[dict[str, Any]]) -> dict[str, bool]:
    """The gRPC expectations over ``runs`` (warm-up and measured): known statuses only, busy ones with retry-after."""
    codes = {code for run in runs for code in run["by_code"]}
    without = sum(run["retry_after"][code]["without"] for run in runs for code in run["retry_after"])
    return {
        "gRPC: calls answered": all(run["calls"] > 0 for run in runs),
        "gRPC: no status but " + ", ".join(GRPC_ALLOWED): codes <= set(GRPC_ALLOWED),
        "gRPC: every RESOURCE_EXHAUSTED/UNAVAILABLE with retry-after": without == 0,
    }


def arguments() -> Parser:
    quick = {
        "duration": 2.0,
        "concurrency": 4,
        "warmup": 1.0,
        "grpc_clients": 4,
        "goodput_duration": 1.0,
        "goodput_clients": "1,4",
    }
    parser = Parser(__name__, __doc__, quick=quick)
    parser.add_duration(60.0, "seconds of the measured run")
    parser.add_argument("--concurrency", type=int, default=64, help="REST connections (default 64)")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds of warm-up (default 10)")
    parser.add_json()
    parser.add_argument(
        "--grpc", action=BooleanOptionalAction, default=True, help="drive gRPC too (default; --no-grpc: not)"
    )
    parser.add_argument("--grpc-clients", type=int, default=64, help="gRPC clients (default 64)")
    parser.add_argument("--goodput", action="store_true", help="measure the goodput table instead (issue 8)")
    parser.add_argument("--goodput-duration", type=float, default=15.0, help="seconds per goodput run (default 15)")
    parser.add_argument(
        "--goodput-clients",
        default="1,16,64",
        help="connections of the goodput runs (default 1,16,64; the check "
        "compares the last with the best of the others)",
    )
    return parser


def main(argv: list[str]) -> int:
    args = arguments().parse(argv)
    if shutil.which("wrk") is None:
        print("wrk is not installed (apt-get install -y wrk)", file=sys.stderr)
        return 2
    if args.goodput:
        clients = tuple(int(x) for x in args.goodput_clients.split(","))
        if len(clients) < 2:
            print("--goodput-clients needs two counts at least", file=sys.stderr)
            return 2
        return goodput(args.goodput_duration, args.json, clients)

    max_body = int(os.environ.get("ATTN_MAX_BODY_BYTES", ONE_MIB))
    budget = int(os.environ.get("ATTN_MEMORY_BUDGET_BYTES", 1 << 30))
    grpc_port = free_port() if args.grpc else 0
    target = f"127.0.0.1:{grpc_port}"
    workdir = Path(tempfile.mkdtemp(prefix="load_test_"))
    env = {
        "ATTN_GRPC_PORT": str(grpc_port),
        "ATTN_MAX_BODY_BYTES": str(max_body),
        "ATTN_LOG_LEVEL": os.environ.get("ATTN_LOG_LEVEL", "info"),  # as production logs: a line per request
    }
    with service(workdir / "server.log", env, timeout_s=120, grace_s=60) as served:
        server, url = served.proc, served.url
        wrk_args: list[str] = []
        requests = build_requests(max_body)
        for kind, (path, body, weight) in requests.items():
            (workdir / f"{kind}.json").write_bytes(body)
            wrk_args += [kind, path, str(workdir / f"{kind}.json")] * weight

        def load(seconds: float, name: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
            """REST (wrk) and, when on, the gRPC driver for ``seconds``, at once; their results."""
            out = workdir / f"grpc_{name}.json"
            driver = start_grpc_load(target, args.grpc_clients, seconds, out) if args.grpc else None
            try:
                rest = run_wrk(url, wrk_args, args.concurrency, seconds)
            finally:
                grpc_result = finish_grpc_load(driver, out, seconds) if driver else None
            return rest, grpc_result

        rss = {"after_start": rss_bytes(server.pid)}
        load_before = os.getloadavg()
        _, grpc_warmup = load(args.warmup, "warmup")
        time.sleep(2.0)
        rss["after_warmup"] = rss_bytes(server.pid)
        result, grpc_result = load(args.duration, "run")
        time.sleep(2.0)  # let the server finish what it was doing
        rss["end"] = rss_bytes(server.pid)
        rss["peak"] = rss_bytes(server.pid, "VmHWM")  # under load, before the idle trim gave the free heap back
        counters = server_counters(url)
        load_after = os.getloadavg()
    exit_code = server.returncode

    by_status: Counter[str] = Counter()
    by_kind: dict[str, Counter[str]] = defaultdict(Counter)
    for key, n in result["counts"]:
        kind, status = key.rsplit(" ", 1)
        by_status[status] += n
        by_kind[kind][status] += n
    answered = sum(by_status.values())
    lost = sum(result["errors"].values())
    growth = rss["end"] / rss["after_warmup"] - 1
    report = {
        "machine": {
            **machine(),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in load_after],
        },
        "settings": {
            "duration_s": args.duration,
            "concurrency": args.concurrency,
            "warmup_s": args.warmup,
            "max_body_bytes": max_body,
            "memory_budget_bytes": budget,
            "grpc_clients": args.grpc_clients if args.grpc else 0,
            "body_bytes": {k: len(b) for k, (_, b, _) in requests.items()},
        },
        "results": {
            "requests_answered": answered,
            "requests_per_s": round(answered / (result["duration_us"] / 1e6), 1),
            "by_status": dict(sorted(by_status.items())),
            "by_kind": {k: dict(sorted(v.items())) for k, v in sorted(by_kind.items())},
            "lost_without_answer": result["errors"],
            "latency_ms": {q: round(result[f"{q}_us"] / 1e3, 2) for q in ("p50", "p90", "p99", "max")},
            "rss_mib": {k: round(v / ONE_MIB, 1) for k, v in rss.items()},
            "rss_change_vs_warmup_pct": round(100 * growth, 1),
            "peak_rss_limit_mib": round((budget + RSS_HEADROOM) / ONE_MIB, 1),
            "grpc": grpc_result,
        },
        "server_counters": counters,
        "server_exit_code_after_sigterm": exit_code,
    }
    server_errors = {s: n for s, n in by_status.items() if s.startswith("5") and s != "503"}
    checks: dict[str, bool] = {
        "no 5xx other than 503": not server_errors,
        "no request lost without an answer": lost == 0 and answered == result["requests"],
        "RSS at the end within 10% of after warm-up": abs(growth) <= 0.10,
        "peak RSS within the memory budget + 400 MiB": rss["peak"] <= budget + RSS_HEADROOM,
    }
    if grpc_result is not None and grpc_warmup is not None:
        checks.update(grpc_checks([grpc_warmup, grpc_result]))
    report["checks"] = checks
    print(json.dumps(report, indent=2))
    print(f"REST: {answered} answers in {args.duration:g} s, by status {dict(sorted(by_status.items()))}, lost {lost}")
    if grpc_result is not None:
        print(
            f"gRPC: {grpc_result['calls']} calls in {grpc_result['duration_s']:g} s, by code {grpc_result['by_code']}, "
            f"retry-after {grpc_result['retry_after']}"
        )
    print(f"peak RSS {rss['peak'] / ONE_MIB:.1f} MiB, budget + 400 MiB = {(budget + RSS_HEADROOM) / ONE_MIB:.1f} MiB")
    for name, ok in checks.items():
        print(f"- {name}: {'met' if ok else 'MISSED'}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0 if all(checks.values()) else 1
