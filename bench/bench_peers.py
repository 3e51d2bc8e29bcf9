"""Peers: the service beside MLServer serving the same attention, in one run, with the same tensors and clients.

    python -m bench peers [--duration 5] [--clients 8] [--rounds 3] [--outputs both|output] [--json out.json]

Needs wrk (as ``python -m bench http``) and the test extras (tritonclient). MLServer runs from a venv of its own,
``build/mlserver-venv`` (``--mlserver-venv``); a run that finds none creates it first, once, about a minute:
``python3.11 -m venv build/mlserver-venv && build/mlserver-venv/bin/pip install 'mlserver==1.7.*'``.

The run starts both servers, one process each, and stops them at the end:

- ours as production runs it (``python -m service serve --workers 1``; ``ATTN_LOG_LEVEL=warning``, no access
  line per request; every other ``ATTN_*`` setting from the environment, ONNX on unless it says otherwise, as
  ``python -m bench http`` does);
- MLServer (``mlserver start``) with ``bench/peers_runtime.py``: a custom ``mlserver.MLModel`` decoding query, key
  and value with ``NumpyCodec`` and computing softmax attention in numpy (``scores = q k^T / sqrt(E)``, softmax,
  ``output = weights v``), FP32 out; ``parallel_workers`` 0 (inference in the serving process, as ours;
  ``--mlserver-workers``), ``debug`` false (no access log), its metrics server on a port of its own.

The same request to each, for tiny (1, 1, 4, 4) and medium (1, 8, 128, 64) float32 tensors (one draw, seed 0),
outputs ``output`` and ``weights`` asked of both (MLServer's runtime forms the weights either way, so this asks the
same work and the same bytes of each; ``--outputs output`` asks for the output alone, which lets ours pick a graph
that skips them); ours with ``parameters.diagnostics`` false (its ``/v2`` returns diagnostics by default), except
in the row "our defaults". Forms: REST ``/v2`` JSON (the same bytes to both), REST ``/v2`` with the binary tensor data
extension (inputs and outputs binary; n/a for a server that does not answer it), gRPC with ``tritonclient.grpc``
(raw tensors), and for reference our ``/v1/attention`` JSON (lists, ``return`` the same outputs).

Before timing, every answer is checked against MLServer's REST JSON answer (within 1e-6, absolute and relative).
Then, in ``--rounds`` rounds, each cell in turn (the two servers alternate which goes first):

- REST: wrk (``bench/http_post.lua``, keep-alive, one thread, no ``Accept-Encoding``): p50 and p99 over one
  connection, answers/s over ``--clients`` connections;
- gRPC: ``tritonclient.grpc``, as ``python -m bench grpc``: p50 and p99 of sequential calls of one client, answers/s
  of ``--clients`` threads with a client each.

Prints one table (rows: shape x form x server; the median of the rounds), ratios ours / MLServer for p50 and
answers/s, issue 29 item 8's targets, and the settings and versions of both servers.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import tritonclient.grpc as tg

from bench.bench_grpc import latency, throughput
from bench.bench_http import send, server, wrk
from bench.http_cases import tensors
from bench.peers_mlserver import DEFAULT_VENV, MLSERVER_SPEC, ensure_mlserver, mlserver_folder
from bench.peers_report import (
    DEFAULTS,
    FORMS,
    GRPC,
    OURS,
    OUTPUTS,
    PEER,
    REST_BINARY,
    REST_JSON,
    SHAPES,
    TOLERANCE,
    V1,
    Cell,
    Measure,
    Run,
    print_notes,
    print_table,
    print_targets,
    report,
)
from bench.ports import free_port
from bench.suite import Parser

V2_PATH = "/v2/models/attention/infer"


@dataclass(frozen=True)
class Endpoint:
    rest: str
    """http://host:port"""
    grpc: str
    """host:port"""


@contextmanager
def servers(tmp: Path, venv: Path, mlserver_workers: int) -> Iterator[dict[str, Endpoint]]:
    """Both servers on free ports, ready; stopped on leaving."""
    rest, grpc, peer_rest, peer_grpc = (free_port() for _ in range(4))
    ours_cmd = [sys.executable, "-m", "service", "serve", "--host", "127.0.0.1", "--port", str(rest)]
    ours_cmd += ["--grpc-port", str(grpc), "--workers", "1"]
    folder = mlserver_folder(tmp / "mlserver", peer_rest, peer_grpc, free_port(), mlserver_workers)
    peer_cmd = [str(venv / "bin" / "mlserver"), "start", str(folder)]
    with ExitStack() as stack:
        stack.enter_context(server(ours_cmd, f"http://127.0.0.1:{rest}/readyz", tmp / "ours.log"))
        ready = f"http://127.0.0.1:{peer_rest}/v2/models/attention/ready"
        stack.enter_context(server(peer_cmd, ready, tmp / "mlserver.log"))
        yield {
            OURS: Endpoint(f"http://127.0.0.1:{rest}", f"127.0.0.1:{grpc}"),
            PEER: Endpoint(f"http://127.0.0.1:{peer_rest}", f"127.0.0.1:{peer_grpc}"),
        }


# --------------------------------------------------------------------------- requests and answers


def v2_request(
    arrays: dict[str, np.ndarray], outputs: tuple[str, ...], binary: bool, diagnostics: bool | None
) -> tuple[bytes, dict[str, str]]:
    """A /v2 inference request (body, headers) asking for ``outputs``; ``parameters.diagnostics`` unless
    ``diagnostics`` is None (the server's default).
    """
    inputs = []
    for name, a in arrays.items():
        spec: dict[str, Any] = {"name": name, "shape": list(a.shape), "datatype": "FP32"}
        if binary:
            spec["parameters"] = {"binary_data_size": a.nbytes}
        else:
            spec["data"] = a.reshape(-1)
        inputs.append(spec)
    request: dict[str, Any] = {
        "inputs": inputs,
        "outputs": [{"name": n, "parameters": {"binary_data": binary}} for n in outputs],
    }
    if diagnostics is not None:
        request["parameters"] = {"diagnostics": diagnostics}
    header = orjson.dumps(request, option=orjson.OPT_SERIALIZE_NUMPY)
    if not binary:
        return header, {"Content-Type": "application/json"}
    body = header + b"".join(a.tobytes() for a in arrays.values())
    return body, {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))}


def decode_v2(content: bytes, headers: dict[str, str]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """A /v2 answer's outputs (JSON data or binary) and its parameters."""
    lower = {k.lower(): v for k, v in headers.items()}
    n = int(lower.get("inference-header-content-length", len(content)))
    head = orjson.loads(content[:n])
    offset, arrays = n, {}
    for o in head["outputs"]:
        size = (o.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            a = np.frombuffer(content[offset : offset + size], dtype="<f4")
            offset += size
        else:
            a = np.asarray(o["data"], dtype=np.float32)
        arrays[o["name"]] = a.reshape(o["shape"])
    return arrays, head.get("parameters") or {}


def rest_measure(url: str, body: bytes, headers: dict[str, str], tmp: Path) -> Measure:
    body_file = tmp / f"body-{len(list(tmp.glob('body-*')))}"
    body_file.write_bytes(body)

    def measure(duration: float, clients: int, warm: bool) -> tuple[float, float, float]:
        if warm:
            wrk("POST", url, body_file, headers, 1, min(1.0, duration))
        one = wrk("POST", url, body_file, headers, 1, duration)
        many = wrk("POST", url, body_file, headers, clients, duration)
        for run in (one, many):
            if run["non_2xx"] or run["socket_errors"]:
                raise SystemExit(f"POST {url}: {run['non_2xx']} non-2xx answers, {run['socket_errors']} socket errors")
        return one["p50_us"] / 1e3, one["p99_us"] / 1e3, float(many["rps"])

    return measure


def grpc_maker(
    target: str, arrays: dict[str, np.ndarray], names: tuple[str, ...]
) -> Callable[[], Callable[[], dict[str, np.ndarray]]]:
    """A maker of calls: each call a client of its own (tritonclient.grpc, raw tensors, diagnostics off)."""

    def make() -> Callable[[], dict[str, np.ndarray]]:
        client = tg.InferenceServerClient(target)
        inputs = []
        for name, a in arrays.items():
            t = tg.InferInput(name, list(a.shape), "FP32")
            t.set_data_from_numpy(a)
            inputs.append(t)
        outputs = [tg.InferRequestedOutput(n) for n in names]

        def call() -> dict[str, np.ndarray]:
            result = client.infer("attention", inputs, outputs=outputs, parameters={"diagnostics": False})
            return {n: result.as_numpy(n) for n in names}

        return call

    return make


def grpc_measure(make: Callable[[], Callable[[], Any]]) -> Measure:
    def measure(duration: float, clients: int, warm: bool) -> tuple[float, float, float]:
        p50, p99, _ = latency(make(), duration)  # its own warm-up: 50 calls
        return p50, p99, throughput(make, clients, duration)

    return measure


def agree(name: str, got: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> float:
    """The largest |got - ref| over MLServer's outputs; a SystemExit past the tolerance."""
    worst = 0.0
    for n in ref:
        a, b = np.asarray(got[n], dtype=np.float32), ref[n]
        if a.shape != b.shape:
            raise SystemExit(f"{name}: {n} has shape {a.shape}, MLServer's {b.shape}")
        if not np.allclose(a, b, rtol=TOLERANCE, atol=TOLERANCE):
            raise SystemExit(f"{name}: {n} differs from MLServer's by up to {np.max(np.abs(a - b)):.3g}")
        worst = max(worst, float(np.max(np.abs(a - b))))
    return worst


def build(
    shape_name: str, outputs: tuple[str, ...], urls: dict[str, Endpoint], tmp: Path, facts: dict[str, Any]
) -> list[Cell]:
    """The cells of one shape, every answer checked against MLServer's REST JSON answer first."""
    shape = SHAPES[shape_name]
    arrays = dict(zip(("query", "key", "value"), tensors(shape), strict=True))
    cells: list[Cell] = []
    json_body, json_headers = v2_request(arrays, outputs, False, diagnostics=False)
    status, content, headers = send("POST", urls[PEER].rest + V2_PATH, json_body, json_headers)
    if status != 200:
        raise SystemExit(f"MLServer, {shape_name} /v2 JSON: {status} {content[:500]!r}")
    ref, _ = decode_v2(content, headers)
    diffs: dict[str, float] = {}
    for form, who in FORMS:
        for server_name in who:
            cell = Cell(shape_name, form, server_name)
            label = f"{server_name}, {shape_name} {form}"
            url = urls[server_name].rest
            if form == GRPC:
                make = grpc_maker(urls[server_name].grpc, arrays, outputs)
                diffs[label] = agree(label, make()(), ref)
                cell.measure = grpc_measure(make)
            else:
                if form == V1:
                    path, headers_ = "/v1/attention", {"Content-Type": "application/json"}
                    body = orjson.dumps({**{n: a.tolist() for n, a in arrays.items()}, "return": list(outputs)})
                else:
                    path = V2_PATH
                    diagnostics = None if form == DEFAULTS else False
                    body, headers_ = v2_request(arrays, outputs, form == REST_BINARY, diagnostics)
                status, content, answer_headers = send("POST", url + path, body, headers_)
                if status != 200:
                    if server_name == PEER and form == REST_BINARY:
                        cell.note = f"n/a: answers {status} to a binary request"
                        facts["mlserver_binary"] = f"{status} {content[:200].decode(errors='replace')}"
                        cells.append(cell)
                        continue
                    raise SystemExit(f"{label}: {status} {content[:500]!r}")
                if form == V1:
                    answer = orjson.loads(content)
                    got = {n: np.asarray(answer[n], dtype=np.float32) for n in outputs}
                else:
                    got, parameters = decode_v2(content, answer_headers)
                    if server_name == OURS and form == REST_JSON:
                        facts.setdefault("engine", {})[shape_name] = (
                            f"{parameters.get('engine', '?')} ({parameters.get('engine_reason', '')})"
                        )
                diffs[label] = agree(label, got, ref)
                cell.measure = rest_measure(url + path, body, headers_, tmp)
            cells.append(cell)
    facts.setdefault("max_abs_diff", {})[shape_name] = max(diffs.values())
    return cells


def arguments() -> Parser:
    parser = Parser(__name__, __doc__, quick={"duration": 0.2, "clients": 2, "rounds": 1})
    parser.add_duration(5.0, "seconds per measurement (wrk rounds it to whole seconds, at least 1)")
    parser.add_clients(8, "concurrent clients of the answers/s runs (wrk connections; gRPC threads)")
    parser.add_rounds(3, "rounds over every cell, the servers alternating; the table shows each cell's median")
    parser.add_json()
    parser.add_argument(
        "--outputs",
        choices=sorted(OUTPUTS),
        default="both",
        help="what both servers return: output and weights (default; the same work and bytes of each: MLServer's "
        "runtime computes the weights either way), or output alone (ours may then skip forming the weights)",
    )
    parser.add_argument(
        "--mlserver-venv",
        type=Path,
        default=DEFAULT_VENV,
        help=f"MLServer's venv, created with {MLSERVER_SPEC} if it has no mlserver (default build/mlserver-venv)",
    )
    parser.add_argument(
        "--mlserver-workers",
        type=int,
        default=0,
        help="MLServer's parallel_workers: 0 runs inference in its serving process, as ours (default 0; "
        "MLServer's own default is 1, a worker process beside it)",
    )
    return parser


def main(argv: list[str]) -> int:
    args = arguments().parse(argv)
    outputs = OUTPUTS[args.outputs]
    if shutil.which("wrk") is None:
        print("wrk is not installed: `apt-get install -y wrk` (Debian/Ubuntu) or `brew install wrk`", file=sys.stderr)
        return 2
    peer_versions = ensure_mlserver(args.mlserver_venv)
    started = time.monotonic()
    load_start = os.getloadavg()
    facts: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, servers(Path(tmp), args.mlserver_venv, args.mlserver_workers) as urls:
        cells = [cell for shape in SHAPES for cell in build(shape, outputs, urls, Path(tmp), facts)]
        for r in range(max(1, args.rounds)):
            # Pairs alternate which server goes first from one round to the next.
            order: list[Cell] = []
            for shape in SHAPES:
                for form, _ in FORMS:
                    group = [c for c in cells if c.shape == shape and c.form == form]
                    order += group if r % 2 == 0 else group[::-1]
            for cell in order:
                if cell.measure is None:
                    continue
                p50, p99, rps = cell.measure(args.duration, args.clients, r == 0)
                cell.p50.append(p50)
                cell.p99.append(p99)
                cell.rps.append(rps)
                print(
                    f"  round {r + 1}: {cell.shape} {cell.form}, {cell.server}: p50 {p50:.3f} ms, {rps:.0f}/s",
                    file=sys.stderr,
                    flush=True,
                )
    load_end = os.getloadavg()
    run = Run(
        rounds=max(1, args.rounds),
        duration=args.duration,
        clients=args.clients,
        outputs_option=args.outputs,
        load_start=load_start,
        load_end=load_end,
        seconds=time.monotonic() - started,
        peer_versions=peer_versions,
        venv=str(args.mlserver_venv),
        mlserver_workers=args.mlserver_workers,
        facts=facts,
    )
    print_table(cells, args.clients, run.peer_name)
    print_targets(cells)
    print()
    print_notes(run)
    if args.json:
        Path(args.json).write_text(json.dumps(report(run, cells), indent=2) + "\n")
    return 0
