"""The benchmarks (not timed tests: the test suite never runs them), one suite with one entry:
``python -m bench NAME [options]``, or ``make bench NAME=... ARGS='...'``; ``python -m bench`` lists them.

- ``suite``: the registry of benchmarks and helper modules, the runner (the machine header first) and the
  common options (``--quick``, ``--repeats``, ``--rounds``, ``--duration``, ``--clients``, ``--json``);
- ``machine``: the header: CPU, clock, BLAS library and kernel, versions, load average;
- ``bench_*``, ``load_test``: the benchmarks, one module each (bench/README.md lists them);
- ``timing``, ``ports``, ``asgi``, ``http_cases``, ``http_report``, ``peers_mlserver``, ``peers_report``: what they
  share or hold for one benchmark;
- ``peers_runtime``: the MLServer runtime of ``peers``, imported by MLServer in its own venv, never here;
- ``http_bare_app``, ``http_edge_floor``, ``load_grpc``: processes a benchmark starts (servers, a load driver).

Modules import one another as ``bench.x`` and run from the repository's root (``python -m``): nothing edits
``sys.path``, and nothing replaces a name in the service's modules (``tests/bench`` checks both).
"""
