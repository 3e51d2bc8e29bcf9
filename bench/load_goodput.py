"""Goodput (issue 8), ``python -m bench load --goodput``: how many valid medium requests (/v2 (1, 8, 128, 64)
float32 with output and weights, JSON and binary) are answered 200 per second at 1, 16 and 64 clients (wrk,
``bench/load_goodput.lua``), with the 503s per second and p50/p99; the issue's target: at 64 clients at least
0.8x the best of 1 and 16, and no 5xx but 503.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.http_cases import v2_body
from bench.serving import ROOT, service

GOODPUT_LUA = ROOT / "bench" / "load_goodput.lua"
GOODPUT_SHAPE = (1, 8, 128, 64)
GOODPUT_CLIENTS = (1, 16, 64)


def run_goodput_wrk(url: str, body: Path, headers: dict[str, str], clients: int, seconds: float) -> dict[str, Any]:
    env = {**os.environ, "BENCH_BODY": str(body), "BENCH_HEADERS": "\n".join(f"{k}: {v}" for k, v in headers.items())}
    cmd = ["wrk", f"-t{min(2, clients)}", f"-c{clients}", f"-d{seconds:g}s", "--timeout", "60s", "-s", str(GOODPUT_LUA)]
    done = subprocess.run(
        [*cmd, url + "/v2/models/attention/infer"], capture_output=True, text=True, env=env, timeout=seconds + 120
    )
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("GOODPUT ")), None)
    if line is None:
        raise RuntimeError(f"wrk failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    result: dict[str, Any] = json.loads(line[8:])
    return result


def goodput(seconds: float, json_out: str | None, clients_list: tuple[int, ...] = GOODPUT_CLIENTS) -> int:
    """The goodput table: 200s/s, 503s/s, p50/p99 of valid medium /v2 requests (the HTTP benchmark's) at 1, 16
    and 64 clients.
    """
    workdir = Path(tempfile.mkdtemp(prefix="goodput_"))
    rows: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    with service(workdir / "server.log", timeout_s=120, grace_s=60) as served:
        url = served.url
        for fmt, binary in (("JSON", False), ("binary", True)):
            body, headers = v2_body(GOODPUT_SHAPE, binary)
            path = workdir / f"{fmt}.bin"
            path.write_bytes(body)
            assert httpx.post(url + "/v2/models/attention/infer", content=body, headers=headers, timeout=60).is_success
            run_goodput_wrk(url, path, headers, 16, min(5.0, seconds))  # warm-up
            for clients in clients_list:
                time.sleep(1.0)
                r = run_goodput_wrk(url, path, headers, clients, seconds)
                elapsed = r["duration_us"] / 1e6
                by_status: dict[int, int] = {}
                for status, n in r["counts"]:  # one [status, n] pair per wrk thread: add them up
                    by_status[status] = by_status.get(status, 0) + n
                rows.append(
                    {
                        "format": fmt,
                        "clients": clients,
                        "body_bytes": len(body),
                        "ok_per_s": round(by_status.get(200, 0) / elapsed, 1),
                        "refused_503_per_s": round(by_status.get(503, 0) / elapsed, 1),
                        "other_status": {s: n for s, n in by_status.items() if s not in (200, 503)},
                        "socket_errors": r["socket_errors"],
                        "p50_ms": round(r["p50_us"] / 1e3, 1),
                        "p99_ms": round(r["p99_us"] / 1e3, 1),
                    }
                )
    checks: dict[str, bool] = {}
    print(f"load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}; {seconds:g} s per run")
    print("| /v2 (1, 8, 128, 64) float32 | clients | 200/s | 503/s | p50 ms | p99 ms | other |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for row in rows:
        other = row["other_status"] or ""
        if row["socket_errors"]:
            other = f"{other} socket errors {row['socket_errors']}".strip()
        print(
            f"| {row['format']} ({row['body_bytes']} B) | {row['clients']} | {row['ok_per_s']} | "
            f"{row['refused_503_per_s']} | {row['p50_ms']} | {row['p99_ms']} | {other} |"
        )
    for fmt in ("JSON", "binary"):
        by_clients = {row["clients"]: row for row in rows if row["format"] == fmt}
        *fewer, most = clients_list
        best = max(by_clients[n]["ok_per_s"] for n in fewer)
        at_most = by_clients[most]["ok_per_s"]
        others = " and ".join(str(n) for n in fewer)
        checks[f"{fmt}: {most} clients >= 0.8x the best of {others} ({at_most} vs {best})"] = at_most >= 0.8 * best
        checks[f"{fmt}: no 5xx but 503"] = not any(
            int(s) >= 500 and int(s) != 503 for row in by_clients.values() for s in row["other_status"]
        )
    for name, ok in checks.items():
        print(f"- {name}: {'met' if ok else 'MISSED'}")
    if json_out:
        Path(json_out).write_text(json.dumps({"rows": rows, "checks": checks}, indent=2) + "\n")
    return 0 if all(checks.values()) else 1
