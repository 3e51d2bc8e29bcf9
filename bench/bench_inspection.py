"""What the per-head inspection costs a medium request (issue 31's target), over the socket, in one run.

    python -m bench inspection [--rounds 5] [--calls 200] [--baseline REF]

Serves ``attention`` as production does (``python -m service serve``) and times sequential ``/v2`` requests with
tritonclient.http and binary tensors, (1, 8, 128, 64) float32, output and weights back, diagnostics on (the
default), in interleaved rounds: with the inspection off and on (``inspection: true``, no token ids). With
``--baseline REF`` a second server runs the checkout of ``REF`` (a git worktree under ``build/``), a version
without the inspection, timed the same way in the same rounds: the inspection's presence when it is off.
Each cell is the median of the rounds' p50s. Targets: on at most 1.10x off; off within the run-to-run noise
(about 2%) of the baseline. Then the server's own account of where the time goes: ``/v1`` JSON requests of the same
tensors, with and without ``inspection`` in ``return``, alternating, and the medians of the phases of their
``timing_ms`` (the inspection is part of ``diagnostics``).
"""

from __future__ import annotations

import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import httpx
import numpy as np
import orjson
import tritonclient.http as th

from bench.serving import ROOT, service
from bench.suite import Parser

SHAPE = (1, 8, 128, 64)


def arguments() -> Parser:
    parser = Parser(__name__, __doc__, quick={"rounds": 1, "calls": 10, "phase_calls": 5})
    parser.add_rounds(5)
    parser.add_argument("--calls", type=int, default=200, help="requests per round and form (default 200)")
    parser.add_argument("--baseline", help="a git ref without the inspection, served beside this checkout")
    parser.add_argument("--phase-calls", type=int, default=200, help="/v1 requests of each kind for the phases")
    return parser


def caller(url: str, inspection: bool | None) -> Callable[[], object]:
    rng = np.random.default_rng(0)
    client = th.InferenceServerClient(url)
    inputs = []
    for name in ("query", "key", "value"):
        tensor = th.InferInput(name, list(SHAPE), "FP32")
        tensor.set_data_from_numpy(rng.standard_normal(SHAPE, dtype=np.float32), binary_data=True)
        inputs.append(tensor)
    outputs = [th.InferRequestedOutput(n, binary_data=True) for n in ("output", "weights")]
    parameters = {} if inspection is None else {"inspection": inspection}

    def call() -> object:
        return client.infer("attention", inputs, outputs=outputs, parameters=parameters)

    return call


def p50(call: Callable[[], object], calls: int) -> float:
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def phases(url: str, calls: int) -> dict[str, dict[str, float]]:
    """The medians of ``timing_ms`` over ``calls`` ``/v1`` requests with the inspection off and as many on,
    alternating, after ten of each to warm up.
    """
    rng = np.random.default_rng(0)
    arrays = {name: rng.standard_normal(SHAPE, dtype=np.float32).tolist() for name in ("query", "key", "value")}
    returned = ["output", "weights", "diagnostics"]
    bodies = {
        "inspection off": orjson.dumps({**arrays, "return": returned}),
        "inspection on": orjson.dumps({**arrays, "return": [*returned, "inspection"]}),
    }
    seen: dict[str, dict[str, list[float]]] = {name: {} for name in bodies}
    with httpx.Client(base_url=f"http://{url}", timeout=60) as client:
        for i in range(calls + 10):
            for name, body in bodies.items():
                response = client.post("/v1/attention", content=body, headers={"content-type": "application/json"})
                response.raise_for_status()
                if i >= 10:
                    for phase, ms in response.json()["timing_ms"].items():
                        seen[name].setdefault(phase, []).append(ms)
    return {name: {phase: statistics.median(v) for phase, v in found.items()} for name, found in seen.items()}


def worktree(ref: str) -> Path:
    path = ROOT / "build" / f"bench-baseline-{ref.replace('/', '-')}"
    if not path.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(path), ref], cwd=ROOT, check=True)
    return path


def main(argv: list[str]) -> int:
    args = arguments().parse(argv)
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        rest = stack.enter_context(service(Path(tmp) / "service.log")).rest
        forms: dict[str, Callable[[], object]] = {
            "inspection off": caller(rest, False),
            "inspection on": caller(rest, True),
        }
        if args.baseline:
            base = stack.enter_context(service(Path(tmp) / "baseline.log", root=worktree(args.baseline))).rest
            forms[f"baseline {args.baseline}"] = caller(base, None)
        for call in forms.values():  # warm every path
            for _ in range(30):
                call()
        results: dict[str, list[float]] = {name: [] for name in forms}
        for _ in range(args.rounds):
            for name, call in forms.items():
                results[name].append(p50(call, args.calls))
        phase_ms = phases(rest, args.phase_calls)
    medians = {name: statistics.median(values) for name, values in results.items()}
    print(f"/v2 binary {SHAPE} float32, output + weights + diagnostics; median of {args.rounds} rounds' p50s\n")
    print("| server and form | p50 (ms) | rounds' spread (ms) | ratio |")
    print("|---|---:|---:|---|")
    off = medians["inspection off"]
    for name, values in results.items():
        ratio = medians[name] / off
        print(f"| {name} | {medians[name]:.2f} | {min(values):.2f} to {max(values):.2f} | {ratio:.3f}x off |")
    on_ratio = medians["inspection on"] / off
    print(f"\n- on / off: {on_ratio:.3f} (target <= 1.10): {'met' if on_ratio <= 1.10 else 'missed'}")
    if args.baseline:
        base_ratio = off / medians[f"baseline {args.baseline}"]
        print(f"- off / baseline: {base_ratio:.3f} (target: within the noise, about 1.02)")
    print(f"\nThe server's phases (`timing_ms`, ms): /v1 JSON, the same tensors, median of {args.phase_calls} each\n")
    off_ms, on_ms = phase_ms["inspection off"], phase_ms["inspection on"]
    print("| phase | inspection off | inspection on | on - off |")
    print("|---|---:|---:|---:|")
    for phase in off_ms:
        print(f"| {phase} | {off_ms[phase]:.3f} | {on_ms[phase]:.3f} | {on_ms[phase] - off_ms[phase]:+.3f} |")
    return 0
