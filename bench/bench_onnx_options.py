"""Benchmark: ONNX Runtime's run options for the graphs the ONNX engine routes large requests to (issue 32, item 2).

For the graph the engine runs each case on (float32: ``softmax_flash_f32`` for output only at (4, 12, 512, 64) and
(1, 8, 4096, 64), ``softmax_fused_weights_f32`` with weights at (4, 12, 512, 64); ``python -m bench kernels`` prints
which graph ran), eight ways, each case in a process of its own (:mod:`bench.onnx_options_case`) and the ways
interleaved over ``--rounds``:

- the memory arena off (the engine's default, ``ATTN_ONNX_MEMORY_ARENA=false``) or on;
- ``InferenceSession.run`` (as the engine calls it) or IO binding with the output preallocated;
- glibc's malloc as it comes, or with transparent huge pages asked for (``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``:
  malloc advises ``MADV_HUGEPAGE`` on the memory it maps, as numpy already does for its own large arrays; ONNX
  Runtime allocates with malloc), so that a fresh large buffer costs a fault per 2 MiB instead of per 4 KiB.

Printed per case and way: the median over rounds of each process's median time, the growth of peak RSS over the
ready process, and the memory the process still holds after its calls (what the arena keeps). Each way's time is
also given against the engine's own (arena off, ``run``) in the same rounds. The engine adopts a way where it pays
(faster beyond the run-to-run noise, without holding memory a large request would leave behind).

    python -m bench onnx-options [--rounds 3] [--repeats 9]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench.suite import Parser
from service.engines.onnx_engine.heap import with_tunable

ROOT = Path(__file__).resolve().parents[1]
# (label, graph, B, H, L, E, with weights)
CASES = [
    ("(4, 12, 512, 64) output", "softmax_flash_f32", 4, 12, 512, 64, False),
    ("(1, 8, 4096, 64) output", "softmax_flash_f32", 1, 8, 4096, 64, False),
    ("(4, 12, 512, 64) output + weights", "softmax_fused_weights_f32", 4, 12, 512, 64, True),
]
WAYS = [(arena, mode, pages) for pages in ("default", "huge") for arena in ("off", "on") for mode in ("run", "bound")]
"""(arena, mode, malloc's pages); the first is the engine's own."""


def arguments() -> Parser:
    parser = Parser(__name__, __doc__, quick={"rounds": 1, "repeats": 1})
    parser.add_rounds(3)
    parser.add_repeats(9)
    return parser


def run_case(arena: str, mode: str, pages: str, case: tuple, repeats: int) -> dict:
    _, graph, B, H, L, E, weights = case
    argv = [int(arena == "on"), mode, graph, B, H, L, E, int(weights), repeats]
    env = with_tunable({**os.environ, "PYTHONPATH": str(ROOT)}, "1" if pages == "huge" else None)
    done = subprocess.run(
        [sys.executable, "-m", "bench.onnx_options_case", *map(str, argv)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
    )
    if done.returncode != 0:
        raise SystemExit(f"{case[0]}, arena {arena}, {mode}, {pages} pages: {done.stderr.strip()[-2000:]}")
    result: dict = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str]) -> int:
    args = arguments().parse(argv)
    found: dict[tuple[str, str, str, str], list[dict]] = {}
    for _ in range(args.rounds):
        for case in CASES:
            for arena, mode, pages in WAYS:
                found.setdefault((case[0], arena, mode, pages), []).append(
                    run_case(arena, mode, pages, case, args.repeats)
                )
    print(
        f"float32, each cell the median over {args.rounds} round(s) of a process's median of {args.repeats} calls; "
        "peak: growth of peak RSS over the ready process; held: RSS still held over it after the calls\n"
    )
    print(
        "| case | graph | arena | call | malloc's pages | ms (rounds' range) | / the engine's way | peak (MB) "
        "| held (MB) |"
    )
    print("|---|---|---|---|---|---:|---:|---:|---:|")
    for case in CASES:
        base = statistics.median(r["ms"] for r in found[(case[0], *WAYS[0])])
        for arena, mode, pages in WAYS:
            rows = found[(case[0], arena, mode, pages)]
            ms = statistics.median(r["ms"] for r in rows)
            peak = statistics.median(r["peak_mb"] for r in rows)
            held = statistics.median(r["held_mb"] for r in rows)
            spread = f"{min(r['ms'] for r in rows):.1f} to {max(r['ms'] for r in rows):.1f}"
            call = "run" if mode == "run" else "IO binding"
            print(
                f"| {case[0]} | {case[1]} | {arena} | {call} | {'huge (hugetlb=1)' if pages == 'huge' else 'default'} "
                f"| {ms:.1f} ({spread}) | {ms / base:.2f} | {peak:.1f} | {held:.1f} |"
            )
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0
