"""The benchmarks, one entry: ``python -m bench NAME [options]`` (``make bench NAME=... ARGS='...'``).

:data:`BENCHMARKS` names every benchmark (its module, what it measures, what it needs, its page in
docs/benchmarks/); :data:`HELPERS` every other module of ``bench/`` and what it is. :func:`run` prints the
machine header (:mod:`bench.machine`), then calls the benchmark's ``main(argv)``: no benchmark can leave it out.

A benchmark module has ``arguments()``, its :class:`Parser`, and ``main(argv) -> int``. The parser brings the
suite's conventions: ``--quick`` (the smallest settings, a smoke run that proves the benchmark runs: its figures
mean nothing) and, where a benchmark has them, ``--repeats``, ``--rounds``, ``--duration``, ``--clients`` and
``--json`` with one meaning each.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.machine import header_lines, machine


@dataclass(frozen=True)
class Benchmark:
    name: str
    """What ``python -m bench`` takes."""
    module: str
    summary: str
    """What it measures, in one line."""
    page: str
    """Where its figures go (docs/benchmarks/)."""
    needs: str = ""
    """What it needs beyond ``make serve``'s install: ``test extras`` (``make test`` installs them: tritonclient, httpx,
    the client); wrk is named in the summary."""


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark(
        "numpy-engine",
        "bench.bench_numpy_engine",
        "the numpy engine in process: share of the matmul rate, speed-up over plain numpy",
        "docs/benchmarks/numpy-engine.md",
    ),
    Benchmark(
        "engines",
        "bench.bench_engines",
        "numpy against ONNX Runtime in process, against the matmul rate",
        "docs/benchmarks/engines.md",
    ),
    Benchmark(
        "kernels",
        "bench.bench_kernels",
        "each engine and auto against PyTorch's fused and unfused CPU attention, with peak RSS per case",
        "docs/benchmarks/kernels.md",
        "optional: PyTorch (the bench extra)",
    ),
    Benchmark(
        "onnx-options",
        "bench.bench_onnx_options",
        "ONNX Runtime's arena, IO binding and malloc's huge pages on the graphs large requests run on: time, memory",
        "docs/benchmarks/kernels.md",
    ),
    Benchmark(
        "backward",
        "bench.bench_backward",
        "backward against forward time on each engine",
        "docs/benchmarks/backward.md",
    ),
    Benchmark(
        "diagnostics",
        "bench.bench_diagnostics",
        "attention diagnostics of small inputs: the list path and the default",
        "docs/benchmarks/diagnostics.md",
    ),
    Benchmark(
        "sessions",
        "bench.bench_sessions",
        "decode steps of an attention session (gRPC unary, /v2 binary, gRPC stream) against the stateless request",
        "docs/benchmarks/sessions.md",
        needs="test extras",
    ),
    Benchmark(
        "sessions-soak",
        "bench.soak_sessions",
        "sessions started, stepped and abandoned at random by many clients: memory, idle eviction, exact answers",
        "docs/benchmarks/sessions.md",
    ),
    Benchmark(
        "inspection",
        "bench.bench_inspection",
        "what the per-head inspection costs a medium /v2 request, on and off, against a version without it",
        "docs/benchmarks/inspection.md",
        needs="test extras",
    ),
    Benchmark(
        "rollout",
        "bench.bench_rollout",
        "attention rollout of a 12 x 12 x 512 stack against its matrix products, in process and over HTTP",
        "docs/benchmarks/rollout.md",
        needs="test extras",
    ),
    Benchmark(
        "layers",
        "bench.bench_layers",
        "what the service's layers cost over the bare maths for a tiny request, per form, in process",
        "docs/benchmarks/layers.md",
    ),
    Benchmark(
        "costs",
        "bench.bench_costs",
        "the cost model's time and peak memory per score against measured ones (Linux)",
        "docs/benchmarks/costs.md",
    ),
    Benchmark(
        "middleware",
        "bench.bench_middleware",
        "what the REST edge costs a request, in process (ASGI, no sockets)",
        "docs/benchmarks/middleware.md",
    ),
    Benchmark(
        "http",
        "bench.bench_http",
        "HTTP end to end: every request form against its floors (wrk)",
        "docs/benchmarks/http.md",
    ),
    Benchmark(
        "tail",
        "bench.bench_tail",
        "tail latency of tiny requests with and without ATTN_GC_FREEZE (wrk)",
        "docs/benchmarks/tail-latency.md",
    ),
    Benchmark(
        "grpc",
        "bench.bench_grpc",
        "gRPC against REST /v2 binary with tritonclient, tiny and medium",
        "docs/benchmarks/grpc.md",
        "test extras",
    ),
    Benchmark(
        "peers",
        "bench.bench_peers",
        "ours beside MLServer 1.7 in one run: /v2 JSON, binary, gRPC, tiny and medium (wrk)",
        "docs/benchmarks/peers.md",
        "test extras; build/mlserver-venv, made on first run",
    ),
    Benchmark(
        "sample",
        "bench.bench_sample",
        "/v1/sample: the sampling core against full sorts, in process and over HTTP",
        "docs/benchmarks/sampling.md",
    ),
    Benchmark(
        "client",
        "bench.bench_client",
        "the Python client: identity against gzip answers",
        "docs/benchmarks/client.md",
        "test extras",
    ),
    Benchmark(
        "edges",
        "bench.bench_edges",
        "issue 21's edges: held connections, upload and idle RSS, JSON, route labels",
        "docs/benchmarks/edges.md",
        "test extras",
    ),
    Benchmark(
        "grpc-edges",
        "bench.bench_grpc_edges",
        "issue 27's large messages on both protocols against the memory budget",
        "docs/benchmarks/grpc-edges.md",
        "test extras",
    ),
    Benchmark(
        "load",
        "bench.load_test",
        "load test: REST and gRPC at 64 clients each, mixed; --goodput (wrk)",
        "docs/benchmarks/load-test.md",
        "test extras",
    ),
)

HELPERS: Mapping[str, str] = {
    "bench": "the package (its docstring)",
    "bench.__main__": "python -m bench: the list, or one benchmark",
    "bench.suite": "this registry, the runner and the common options",
    "bench.machine": "the header: CPU, clock, BLAS kernel, versions, load",
    "bench.timing": "median timing and the matmul reference rate",
    "bench.ports": "a free loopback port for a benchmark's servers",
    "bench.serving": "the servers a benchmark starts: a command until ready, the service on free ports, RSS",
    "bench.asgi": "an app driven in process through ASGI, without sockets",
    "bench.http_cases": "http's cases and request bodies",
    "bench.http_report": "http's tables",
    "bench.http_bare_app": "http's floor server: a bare FastAPI app and the bare maths",
    "bench.http_edge_floor": "http's edge floor server: the service's edge, bare maths as the job",
    "bench.peers_mlserver": "peers' MLServer: its venv under build/ (made on the first run), versions, model folder",
    "bench.peers_report": "peers' rows and tables",
    "bench.peers_runtime": "peers' MLServer runtime (numpy attention), loaded by MLServer in its own venv only",
    "bench.load_grpc": "load's gRPC driver, a process of its own (python -m bench.load_grpc --target HOST:PORT)",
    "bench.load_goodput": "load --goodput: the goodput table of valid medium /v2 requests (wrk)",
    "bench.kernel_case": "kernels' one case, a process of its own (its peak RSS its own), PyTorch's too",
    "bench.onnx_options_case": "onnx-options' one case, a process of its own (its peak and held memory its own)",
}
"""Every module of ``bench/`` that is not a benchmark, and what it is (``tests/bench`` checks none is left out)."""


def find(name: str) -> Benchmark | None:
    return next((b for b in BENCHMARKS if b.name == name), None)


def listing() -> str:
    """What ``python -m bench`` prints: the usage, then one line a benchmark."""
    width = max(len(b.name) for b in BENCHMARKS)
    lines = [
        "usage: python -m bench NAME [options]   (make bench NAME=... ARGS='...')",
        "       python -m bench NAME --help      a benchmark's options; --quick: a smoke run, figures meaningless",
        "",
        "benchmarks (bench/README.md: what each measures, its target, its page; [test extras]: make test installs):",
    ]
    for b in BENCHMARKS:
        needs = f" [{b.needs}]" if b.needs else ""
        lines.append(f"  {b.name:<{width}}  {b.summary}{needs}")
    return "\n".join(lines)


def print_header(command: str) -> None:
    """The machine header (:func:`bench.machine.machine`), then a blank line, on standard output."""
    print(*header_lines(machine(), command), "", sep="\n", flush=True)


def run(name: str, argv: Sequence[str]) -> int:
    """Run the benchmark ``name`` with ``argv``: the header first (not for ``--help``), then its ``main``."""
    benchmark = find(name)
    if benchmark is None:
        print(f"python -m bench: no benchmark {name!r}\n\n{listing()}", file=sys.stderr)
        return 2
    module = importlib.import_module(benchmark.module)  # before the header: the BLAS it loads is in it
    if not {"-h", "--help"} & set(argv):
        print_header(" ".join(["python -m bench", name, *argv]))
    return int(module.main(list(argv)) or 0)


class Parser(argparse.ArgumentParser):
    """A benchmark's options: its own, plus ``--quick`` and the suite's common ones (``add_repeats`` ...).

    ``quick`` maps option destinations to the values ``--quick`` gives them; :meth:`parse` applies them.
    """

    def __init__(self, module: str, doc: str | None, *, quick: Mapping[str, Any]) -> None:
        benchmark = next((b for b in BENCHMARKS if b.module == module), None)
        prog = f"python -m bench {benchmark.name}" if benchmark else f"python -m {module}"
        super().__init__(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
        self.quick = dict(quick)
        settings = ", ".join(f"{k}={v}" for k, v in self.quick.items())
        self.add_argument(
            "--quick",
            action="store_true",
            help=f"the smallest settings ({settings}): proves the benchmark runs; its figures mean nothing",
        )

    def add_repeats(self, default: int, help: str = "timed runs per cell; the median is reported") -> None:
        self.add_argument("--repeats", type=int, default=default, help=f"{help} (default {default})")

    def add_rounds(self, default: int, help: str = "interleaved rounds; the median is reported") -> None:
        self.add_argument("--rounds", type=int, default=default, help=f"{help} (default {default})")

    def add_duration(self, default: float, help: str = "seconds per measurement") -> None:
        self.add_argument("--duration", type=float, default=default, help=f"{help} (default {default:g})")

    def add_clients(self, default: int | None, help: str = "concurrent clients") -> None:
        self.add_argument("--clients", type=int, default=default, help=f"{help} (default {default})")

    def add_json(self) -> None:
        self.add_argument("--json", metavar="PATH", help="also write the results here, as JSON")

    def parse(self, argv: Sequence[str] | None) -> argparse.Namespace:
        """The options of ``argv``; with ``--quick``, its settings in place of the given ones."""
        args = self.parse_args(argv)
        if args.quick:
            for dest, value in self.quick.items():
                if not hasattr(args, dest):
                    raise AssertionError(f"{self.prog}: --quick sets {dest!r}, which is not an option")
                setattr(args, dest, value)
        return args
