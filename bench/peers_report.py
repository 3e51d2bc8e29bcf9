"""The rows of ``python -m bench peers`` (``bench/bench_peers.py``) and what it prints: the table, issue 29 item 8's
targets, the notes on settings and versions under them, and the JSON report.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

SHAPES = {"tiny": (1, 1, 4, 4), "medium": (1, 8, 128, 64)}
OUTPUTS = {"both": ("output", "weights"), "output": ("output",)}
"""``--outputs``: what both servers are asked for."""
TOLERANCE = 1e-6
"""Every answer against MLServer's REST JSON answer, absolute and relative."""
OURS, PEER = "ours", "MLServer"
REST_JSON, REST_BINARY, GRPC, V1, DEFAULTS = (
    "REST /v2 JSON",
    "REST /v2 binary",
    "gRPC",
    "REST /v1 JSON (reference)",
    "REST /v2 JSON, our defaults (diagnostics on)",
)
FORMS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (REST_JSON, (OURS, PEER)),
    (REST_BINARY, (OURS, PEER)),
    (GRPC, (OURS, PEER)),
    (V1, (OURS,)),
    (DEFAULTS, (OURS,)),
)
"""(form, servers): the rows of each shape, in order. "our defaults" is our /v2 JSON with diagnostics on."""
RATIO_AGAINST = {REST_JSON: REST_JSON, REST_BINARY: REST_BINARY, GRPC: GRPC, DEFAULTS: REST_JSON}
"""Our row -> MLServer's row its ratios use (same shape); /v1 has none."""

Measure = Callable[[float, int, bool], tuple[float, float, float]]
"""(duration s, clients, warm up first) -> (p50 ms, p99 ms, answers/s)."""


@dataclass
class Cell:
    """One row: a shape, a form, a server; how to measure it and what each round measured."""

    shape: str
    form: str
    server: str
    measure: Measure | None = None
    """None: n/a (``note`` says why)."""
    note: str = ""
    p50: list[float] = field(default_factory=list)
    p99: list[float] = field(default_factory=list)
    rps: list[float] = field(default_factory=list)

    def median(self, name: str) -> float | None:
        values: list[float] = getattr(self, name)
        return statistics.median(values) if values else None


def fmt(x: float | None, digits: int = 3) -> str:
    return "" if x is None else f"{x:.{digits}f}"


def ratio(num: float | None, den: float | None) -> str:
    return "" if num is None or den is None or den == 0 else f"**{num / den:.2f}x**"


def print_table(cells: Sequence[Cell], clients: int, peer_name: str) -> None:
    """Rows shape x form x server, each cell's median over the rounds; ratios ours / MLServer on our rows."""
    by_key = {(c.shape, c.form, c.server): c for c in cells}
    print(
        f"| shape | form | server | p50 ms (1 client) | p99 ms | answers/s ({clients} clients) "
        "| p50 ours / MLServer | answers/s ours / MLServer |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for c in cells:
        shape = f"{c.shape} {SHAPES[c.shape]}"
        server_label = peer_name if c.server == PEER else OURS
        if c.measure is None:
            print(f"| {shape} | {c.form} | {server_label} | {c.note} | | | | |")
            continue
        r50 = rrps = ""
        against = RATIO_AGAINST.get(c.form)
        if c.server == OURS and against:
            peer = by_key.get((c.shape, against, PEER))
            if peer is None or peer.measure is None:
                r50 = rrps = "n/a"
            else:
                r50 = ratio(c.median("p50"), peer.median("p50"))
                rrps = ratio(c.median("rps"), peer.median("rps"))
        print(
            f"| {shape} | {c.form} | {server_label} | {fmt(c.median('p50'))} | {fmt(c.median('p99'))} "
            f"| {fmt(c.median('rps'), 0)} | {r50} | {rrps} |"
        )


def print_targets(cells: Sequence[Cell]) -> None:
    """Issue 29 item 8: tiny p50 at most 0.9x MLServer's and answers/s at least 1.1x on REST /v2 JSON and gRPC;
    medium keeps its lead (p50 at most 1x, answers/s at least 1x).
    """
    by_key = {(c.shape, c.form, c.server): c for c in cells}
    print("\n| issue 29 item 8 (same run) | ours / MLServer | target | |")
    print("|---|---:|---|---|")
    for shape, form in (("tiny", REST_JSON), ("tiny", GRPC), ("medium", REST_JSON), ("medium", GRPC)):
        ours, peer = by_key[(shape, form, OURS)], by_key[(shape, form, PEER)]
        for name, label, target, lower_is_better in (
            ("p50", "p50", 0.9 if shape == "tiny" else 1.0, True),
            ("rps", "answers/s", 1.1 if shape == "tiny" else 1.0, False),
        ):
            a, b = ours.median(name), peer.median(name)
            if a is None or b is None:
                continue
            r = a / b
            met = r <= target if lower_is_better else r >= target
            sign = "<=" if lower_is_better else ">="
            print(f"| {shape} {form} {label} | {r:.2f}x | {sign} {target:g}x | {'met' if met else 'MISSED'} |")


def attn_environment() -> str:
    """The ``ATTN_*`` variables of this environment, which our server inherits."""
    found = {k: v for k, v in sorted(os.environ.items()) if k.startswith("ATTN_")}
    return ", ".join(f"{k}={v}" for k, v in found.items()) or "none (the defaults: ONNX on)"


@dataclass
class Run:
    """What the notes under the table say: the settings, versions and facts of one run."""

    rounds: int
    duration: float
    clients: int
    outputs_option: str
    load_start: Sequence[float]
    load_end: Sequence[float]
    seconds: float
    peer_versions: dict[str, str]
    venv: str
    mlserver_workers: int
    facts: dict[str, Any]
    """``engine`` (shape -> what answered our REST JSON check), ``max_abs_diff`` (shape -> largest difference),
    ``mlserver_binary`` (MLServer's answer to a binary request, when it refused one)."""

    @property
    def peer_name(self) -> str:
        return f"MLServer {self.peer_versions['mlserver']}"


def print_notes(run: Run) -> None:
    outputs = " and ".join(f"`{n}`" for n in OUTPUTS[run.outputs_option])
    v = run.peer_versions
    engines = "; ".join(f"{k} {e}" for k, e in run.facts.get("engine", {}).items())
    diffs = ", ".join(f"{k} {d:.2g}" for k, d in run.facts.get("max_abs_diff", {}).items())
    lines = [
        f"{run.rounds} round(s), each cell's median; {run.duration:g} s per measurement (wrk: whole seconds); load "
        f"average {run.load_start[0]:.2f} at the start, {run.load_end[0]:.2f} at the end; {run.seconds:.0f} s in all",
        f"both servers asked for {outputs} (FP32, `--outputs {run.outputs_option}`); ours with "
        "`parameters.diagnostics` false (/v1: `return` without diagnostics) in every row but the one of our defaults",
        "ours: `python -m service serve --workers 1`, ATTN_LOG_LEVEL=warning; ATTN_* from the environment: "
        f"{attn_environment()}; the engine that answered: {engines}",
        f"{run.peer_name} (Python {v['python']}, numpy {v['numpy']} with {v['blas']}, fastapi {v['fastapi']}, "
        f"uvicorn {v['uvicorn']}, grpcio {v['grpcio']}; {run.venv}): `mlserver start`, parallel_workers "
        f"{run.mlserver_workers}, debug false, the numpy runtime of bench/peers_runtime.py",
    ]
    if "mlserver_binary" in run.facts:
        lines.append(
            f"{run.peer_name} does not take the binary tensor data extension on REST requests: it answered "
            f"{run.facts['mlserver_binary']!r}"
        )
    lines += [
        f"answers agree with MLServer's REST JSON answer before timing: largest |difference| {diffs} "
        f"(tolerance {TOLERANCE:g}, absolute and relative)",
        "clients on the same machine as both servers: REST wrk (bench/http_post.lua, 1 thread, keep-alive), gRPC "
        f"tritonclient.grpc (raw tensors; {run.clients} threads, a client each)",
    ]
    print(*(f"- {line}" for line in lines), sep="\n")


def report(run: Run, cells: Sequence[Cell]) -> dict[str, Any]:
    """The JSON report (``--json``): the run's settings and facts, and every round's figures of every cell."""
    return {
        "clients": run.clients,
        "duration_s": run.duration,
        "rounds": run.rounds,
        "outputs": list(OUTPUTS[run.outputs_option]),
        "load": {"start": list(run.load_start), "end": list(run.load_end)},
        "mlserver": {**run.peer_versions, "parallel_workers": run.mlserver_workers, "venv": run.venv},
        "attn_environment": attn_environment(),
        "facts": run.facts,
        "cells": [
            {
                "shape": list(SHAPES[c.shape]),
                "form": c.form,
                "server": c.server,
                "note": c.note,
                "p50_ms": c.p50,
                "p99_ms": c.p99,
                "answers_per_s": c.rps,
            }
            for c in cells
        ],
    }
