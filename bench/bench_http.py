"""End-to-end HTTP benchmark (issue 4): where the time of a request goes, in one run.

    python -m bench http [--duration 5] [--connections 16] [--rounds 3] [--quick]

Needs wrk (Debian/Ubuntu: ``apt-get install -y wrk``; macOS: ``brew install wrk``).
The run:

1. starts the service the way production runs it (``python -m service serve``:
   uvicorn, one worker, uvloop and httptools, every middleware; the ONNX engine
   as configured by the ``ATTN_*`` environment) and, beside it, a bare FastAPI
   endpoint that reads the body and returns a constant
   (``bench/http_bare_app.py``, the HTTP floor), and the service's app with
   a route of its own in front of /v2 inference that runs the bare app's maths
   as its job (``bench/http_edge_floor.py``, the edge floor),
   all with ``ATTN_LOG_LEVEL`` warning so that none writes an access log line
   per request;
2. for each case, checks one request answers 200, then measures with wrk
   (``bench/http_post.lua``): latency p50/p99 with 1 connection, and
   throughput with 16 connections;
3. right after, runs the same request in process: the service's app called
   through ASGI as uvicorn calls it, without sockets (``bench/asgi.py``): the
   total, and from the answer's own ``timing_ms`` the engine and the
   diagnostics; the rest is everything else the app does (the edge, parse,
   validation, decode, encode, serialize);
4. runs the cases of issue 8's targets (``/healthz``, tiny /v1 and /v2,
   medium /v2 JSON and binary, and their floors) again, ``--rounds`` in all,
   one case after the other in each round: on a small VM their p50s move by
   up to 0.15 ms (tiny) and 30% (medium JSON) from run to run;
5. prints a Markdown table, the machine, and the issue's ratios (the targets'
   from the median of their rounds, each round's p50 below).

The cases and their request bodies are in ``bench/http_cases.py``, the
tables in ``bench/http_report.py``.

The issue 8 table compares, in the same run, tiny requests with diagnostics
to ``GET /healthz`` (target at most 2x) and medium /v2 JSON to medium /v2
binary (target at most 4x), and says met or missed. Its last three rows are
floors. The tiny request's two: the bare app answering the tiny /v2 JSON
request with the service's own maths (``POST /bare/attention``: orjson,
``service.core``'s attention and diagnostics, none of the service's parsing,
validation, budgets, dispatch, metrics or middleware), and the same maths as
the job inside the service's own HTTP edge (its protocol, auth, admission,
body read, scheduler, metrics: all but the job's own layers). The medium one: the bare app carrying the
same bytes in and out (``POST /bare/sized``), simdjson parsing the body and
orjson writing the answer's tensors in-process, and the binary request's
engine and diagnostics; no JSON implementation on this parser, writer and
server goes below it.

Cases: /v1/attention for (1, 1, 4, 4) and (1, 8, 128, 64) with weights and
diagnostics, tensors as nested JSON lists, flat ``data`` and base64 (with
``encoding: base64``); /v2 infer for the same shapes with JSON ``data`` and
with the binary tensor data extension (outputs ``output`` and ``weights``,
diagnostics on, the same work as /v1).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from bench.asgi import ASGIApp, call
from bench.http_cases import LARGE, TARGET_CASES, build_cases, v2_body
from bench.http_report import print_report
from bench.ports import free_port
from bench.serving import process
from bench.suite import Parser
from bench.timing import median_time
from service.app import create_app
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[1]

LUA = ROOT / "bench" / "http_post.lua"
SERVER_ENV = {"ATTN_LOG_LEVEL": "warning", "ATTN_GRPC_PORT": "0"}  # gRPC on (the default), on a free port


# --------------------------------------------------------------------------- servers and wrk


def send(
    method: str, url: str, body: bytes, headers: dict[str, str], timeout: float = 60
) -> tuple[int, bytes, dict[str, str]]:
    req = urllib.request.Request(url, data=body if method == "POST" else None, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


@contextmanager
def server(
    cmd: list[str], ready_url: str, log: Path, timeout: float = 300, env: dict[str, str] | None = None
) -> Iterator[None]:
    """``cmd`` (a server of this benchmark's) with :data:`SERVER_ENV` and ``env``, until the block ends
    (:func:`bench.serving.process`).
    """
    with process(cmd, ready_url, log, env={**SERVER_ENV, **(env or {})}, timeout_s=timeout):
        yield


def wrk(
    method: str, url: str, body_file: Path, headers: dict[str, str], connections: int, duration: float
) -> dict[str, Any]:
    env = {
        **os.environ,
        "BENCH_METHOD": method,
        "BENCH_BODY": str(body_file),
        "BENCH_HEADERS": "\n".join(f"{k}: {v}" for k, v in headers.items()),
    }
    cmd = ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(duration))}s", "--timeout", "30s", "-s", str(LUA), url]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    line = next(x for x in out.splitlines() if x.startswith("BENCH "))
    result = json.loads(line[len("BENCH ") :])
    result["rps"] = result["requests"] / (result["duration_us"] / 1e6)
    return result


# --------------------------------------------------------------------------- cases


V2_PATH = "/v2/models/attention/infer"


class InProcess:
    """The service's app in this process, engines started, called through ASGI on an event loop of its own."""

    def __init__(self, settings: Settings) -> None:
        self.app: ASGIApp = create_app(settings)
        self.app.state.runtime.start_engines()
        self.loop = asyncio.new_event_loop()

    def answer(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[bytes, dict[str, str]]:
        """The app's answer (body, headers) to one POST; a SystemExit unless it is a 200."""
        status, out_headers, content = self.loop.run_until_complete(call(self.app, "POST", path, body, headers))
        if status != 200:
            raise SystemExit(f"in process, POST {path}: {status} {content[:500]!r}")
        return content, out_headers

    def timed(self, path: str, body: bytes, headers: dict[str, str]) -> Callable[[], dict[str, float]]:
        """A run of one request: its total (ms, from the call into the app to the last byte of its answer) and the
        phases of the answer's ``timing_ms`` (/v1's field, /v2's parameter; the JSON part of a binary answer).
        """

        async def once() -> tuple[float, int, dict[str, str], bytes]:
            t0 = time.perf_counter()
            status, out_headers, content = await call(self.app, "POST", path, body, headers)
            return time.perf_counter() - t0, status, out_headers, content

        def run() -> dict[str, float]:
            seconds, status, out_headers, content = self.loop.run_until_complete(once())
            if status != 200:
                raise SystemExit(f"in process, POST {path}: {status} {content[:500]!r}")
            if path == V2_PATH:
                n = int(out_headers.get("inference-header-content-length", len(content)))
                timing = json.loads(orjson.loads(content[:n])["parameters"]["timing_ms"])
            else:
                timing = orjson.loads(content)["timing_ms"]
            return {**timing, "job": timing["total"], "total": seconds * 1e3}

        return run

    def close(self) -> None:
        self.loop.close()


def measure_in_process(run: Callable[[], dict[str, float]], budget_s: float) -> dict[str, float]:
    run()
    samples: list[dict[str, float]] = []
    deadline = time.perf_counter() + budget_s
    while len(samples) < 5 or (time.perf_counter() < deadline and len(samples) < 2000):
        samples.append(run())
    med = {k: statistics.median(s[k] for s in samples) for k in ("total", "job", "compute", "diagnostics")}
    med["codec"] = max(med["total"] - med["compute"] - med["diagnostics"], 0.0)
    return med


def json_codec_floor(body: bytes, answer: bytes, repeat: int = 30) -> dict[str, float]:
    """Milliseconds (median) that JSON text costs on its own: parsing the request with simdjson (the
    service's parser) and writing the answer's float32 tensors with orjson (its writer), nothing else.
    """
    import simdjson

    outputs = [np.asarray(o["data"], dtype=np.float32) for o in orjson.loads(answer)["outputs"]]

    return {
        "parse": median_time(lambda: simdjson.Parser().parse(body), repeat) * 1e3,
        "write": median_time(lambda: orjson.dumps(outputs, option=orjson.OPT_SERIALIZE_NUMPY), repeat) * 1e3,
    }


def versions() -> list[str]:
    """The server side's versions beyond the header's (bench/machine.py): FastAPI, uvicorn, wrk."""
    import fastapi
    import uvicorn

    return [f"- fastapi {fastapi.__version__}, uvicorn {uvicorn.__version__} (uvloop, httptools), wrk {wrk_version()}"]


def wrk_version() -> str:
    out = subprocess.run(["wrk", "--version"], capture_output=True, text=True).stdout
    return out.split()[1] if out else "?"


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def arguments() -> Parser:
    parser = Parser(__name__, __doc__, quick={"duration": 1.0, "rounds": 1})
    parser.add_duration(5.0, "seconds per wrk run")
    parser.add_argument("--connections", type=int, default=16, help="connections of the throughput runs (default 16)")
    parser.add_rounds(3, "rounds of the targets' cases, interleaved; their ratios use the median p50")
    return parser


def main(argv: list[str]) -> int:
    args = arguments().parse(argv)
    duration = args.duration
    rounds = max(1, args.rounds)
    if shutil.which("wrk") is None:
        print(
            "wrk is not installed: `apt-get install -y wrk` (Debian/Ubuntu) or `brew install wrk` (macOS)",
            file=sys.stderr,
        )
        return 2

    load_start = load()
    settings = Settings(**{})  # the environment's ATTN_* settings, as the served app sees them
    local = InProcess(settings)

    medium_json, medium_headers = v2_body(LARGE, False)
    medium_answer, _ = local.answer(V2_PATH, medium_json, medium_headers)
    cases = build_cases(
        lambda body: local.timed("/v1/attention", body, {"Content-Type": "application/json"}),
        lambda body, headers: local.timed(V2_PATH, body, headers),
        len(medium_answer),
    )
    codec_floor = json_codec_floor(medium_json, medium_answer)

    engines_used: dict[str, str] = {}  # /v1 case name -> the engine `auto` chose for it
    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        ports = {"service": free_port(), "bare": free_port(), "edge": free_port()}
        base = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}  # by Case.server
        service_cmd = [sys.executable, "-m", "service", "serve", "--host", "127.0.0.1", "--port", str(ports["service"])]
        bare_cmd = [sys.executable, "-m", "bench.http_bare_app", "--port", str(ports["bare"])]
        edge_cmd = [sys.executable, "-m", "bench.http_edge_floor", "--port", str(ports["edge"])]
        with (
            server(service_cmd, base["service"] + "/readyz", tmpdir / "service.log"),
            server(bare_cmd, base["bare"] + "/openapi.json", tmpdir / "bare.log"),
            server(edge_cmd, base["edge"] + "/readyz", tmpdir / "edge.log"),
        ):
            for i, case in enumerate(cases):
                url = base[case.server] + case.path
                status, content, _ = send(case.method, url, case.body, case.headers)
                if status != 200:
                    raise SystemExit(f"{case.name}: {status} {content[:500]!r}")
                case.response_bytes = len(content)
                if case.path == "/v1/attention":
                    engines_used[case.name] = orjson.loads(content)["engine"]["name"]
                body_file = tmpdir / f"body{i}"
                body_file.write_bytes(case.body)
                wrk(case.method, url, body_file, case.headers, 1, min(1.0, duration))  # warm-up
                case.e2e = wrk(case.method, url, body_file, case.headers, 1, duration)
                case.p50s.append(case.e2e["p50_us"] / 1e3)
                case.e2e_c = wrk(case.method, url, body_file, case.headers, args.connections, duration)
                if case.inproc is not None:  # right after its HTTP runs, under the same load
                    case.local = measure_in_process(case.inproc, budget_s=min(3.0, duration))
                print(
                    f"  {case.name}: p50 {case.e2e['p50_us'] / 1e3:.2f} ms, {case.e2e_c['rps']:.0f} req/s",
                    file=sys.stderr,
                )
            # This VM's p50s move by up to 0.15 ms (tiny) and 30% (medium JSON) from run to run: the
            # targets' cases run again, interleaved, and their ratios use the median.
            by_name = {case.name: (i, case) for i, case in enumerate(cases)}
            for _ in range(rounds - 1):
                for name in TARGET_CASES:
                    i, case = by_name[name]
                    url = base[case.server] + case.path
                    p50 = wrk(case.method, url, tmpdir / f"body{i}", case.headers, 1, duration)["p50_us"] / 1e3
                    case.p50s.append(p50)
    load_end = load()
    local.close()

    print_report(
        cases,
        duration=duration,
        connections=args.connections,
        rounds=rounds,
        machine_lines=versions(),
        load_start=load_start,
        load_end=load_end,
        engines_used=engines_used,
        codec_floor=codec_floor,
    )
    return 0
