"""bench/ is one suite: ``python -m bench`` lists every benchmark, every module of bench/ is a benchmark or a known
helper, each benchmark takes the suite's options, every run prints the machine header first, and no module edits
``sys.path`` or replaces a name of the service's modules (an AST walk; fast: nothing is measured).
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import subprocess
import sys
from pathlib import Path

import pytest

from bench import suite
from bench.machine import FIELDS, header_lines, machine

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
MODULES = {("bench" if p.stem == "__init__" else f"bench.{p.stem}"): p for p in sorted(BENCH.glob("*.py"))}
BENCHMARK_MODULES = {b.module for b in suite.BENCHMARKS}
POSITIONAL = {"edges": ["all"], "grpc-edges": ["all"]}
"""The positional arguments a benchmark needs to parse (its command)."""


def test_python_m_bench_lists_every_benchmark_one_line_each() -> None:
    out = subprocess.run([sys.executable, "-m", "bench"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    for b in suite.BENCHMARKS:
        listed = [line for line in lines if line.split()[:1] == [b.name]]
        assert len(listed) == 1, f"{b.name} is not listed once:\n{out.stdout}"
    unknown = subprocess.run(
        [sys.executable, "-m", "bench", "no-such-benchmark"], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert unknown.returncode == 2 and "no-such-benchmark" in unknown.stderr


def test_every_module_is_a_benchmark_or_a_known_helper() -> None:
    names = [b.name for b in suite.BENCHMARKS]
    assert len(set(names)) == len(names)
    assert set(MODULES) == BENCHMARK_MODULES | set(suite.HELPERS), (
        f"not registered in bench/suite.py: {sorted(set(MODULES) - BENCHMARK_MODULES - set(suite.HELPERS))}; "
        f"registered but missing: {sorted((BENCHMARK_MODULES | set(suite.HELPERS)) - set(MODULES))}"
    )
    assert not BENCHMARK_MODULES & set(suite.HELPERS)
    for b in suite.BENCHMARKS:
        assert (ROOT / b.page).is_file(), f"{b.name}: no page {b.page}"
    readme = (BENCH / "README.md").read_text()
    missing = [b.name for b in suite.BENCHMARKS if f"`python -m bench {b.name}" not in readme]
    assert not missing, f"bench/README.md does not show how to run {missing}"


def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def service_names(module: ast.Module) -> set[str]:
    """The names a module binds to the service's modules or their members (``import service.x``, ``as``, ``from``)."""
    bound: set[str] = set()
    for node in ast.walk(module):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "service" or alias.name.startswith("service."):
                    bound.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "service":
            bound.update(alias.asname or alias.name for alias in node.names)
    return bound


def root(node: ast.expr) -> ast.expr:
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return node


def violations(path: Path) -> list[str]:
    """``file:line what`` for each use of ``sys.path`` and each name of a service module replaced or mutated."""
    found: list[str] = []
    rel = path.name
    body = tree(path)
    service = service_names(body)
    for node in ast.walk(body):
        if isinstance(node, ast.Attribute) and node.attr == "path" and ast.unparse(node.value) == "sys":
            found.append(f"{rel}:{getattr(node, 'lineno', 0)} uses sys.path")
        elif isinstance(node, ast.ImportFrom) and node.module == "sys" and {a.name for a in node.names} & {"path", "*"}:
            found.append(f"{rel}:{getattr(node, 'lineno', 0)} imports sys.path")
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr"):
            targets = [ast.Attribute(value=node.args[0], attr="?")] if node.args else []
        for target in targets:
            base = root(target)
            if target is not base and isinstance(base, ast.Name) and base.id in service:
                found.append(f"{rel}:{getattr(node, 'lineno', 0)} changes {base.id!r}, a name of the service's modules")
    return found


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_sys_path_edits_and_nothing_of_the_service_replaced(module: str) -> None:
    assert not violations(MODULES[module])


def test_the_check_finds_a_monkeypatch_and_a_sys_path_edit(tmp_path: Path) -> None:
    fake = tmp_path / "fake.py"
    fake.write_text(
        "import sys\nimport service.http.v2.routes as routes\nfrom service.core import diagnostics\n"
        "from service.dataplane.models import MODELS\nsys.path.insert(0, 'x')\nroutes.infer_job = None\n"
        "setattr(diagnostics, 'X', 1)\nMODELS['floor'] = None\nlocal = object()\nlocal.x = 1\n"
    )
    assert sorted(line.split()[0] for line in violations(fake)) == ["fake.py:5", "fake.py:6", "fake.py:7", "fake.py:8"]


@pytest.mark.parametrize("module", sorted(BENCHMARK_MODULES))
def test_a_benchmark_runs_only_through_the_suite(module: str) -> None:
    """No ``if __name__ == "__main__"`` (``python -m bench NAME`` is its one entry, which prints the header)."""
    for node in ast.walk(tree(MODULES[module])):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
            left = node.test.left
            assert not (isinstance(left, ast.Name) and left.id == "__name__"), f"{module} runs on its own"


@pytest.mark.parametrize("name", [b.name for b in suite.BENCHMARKS])
def test_each_benchmark_takes_the_suites_options(name: str) -> None:
    benchmark = suite.find(name)
    assert benchmark is not None
    module = importlib.import_module(benchmark.module)
    parser = module.arguments()
    assert isinstance(parser, suite.Parser)
    assert parser.prog == f"python -m bench {name}"
    assert callable(module.main)
    defaults = parser.parse(POSITIONAL.get(name, []))
    quick = parser.parse([*POSITIONAL.get(name, []), "--quick"])  # every --quick setting is one of its options
    assert quick.quick and not defaults.quick
    for dest, value in parser.quick.items():
        assert getattr(quick, dest) == value


def test_the_header_has_every_fact() -> None:
    m = machine()
    assert tuple(m) == FIELDS
    assert isinstance(m["cpu"], str) and m["cpu"]
    assert isinstance(m["cores"], int) and m["cores"] >= 1 and 1 <= m["usable_cores"] <= m["cores"]
    assert m["mhz"]["source"] in ("/proc/cpuinfo", "lscpu", "unknown")
    assert m["blas"], "numpy's BLAS is loaded: threadpoolctl sees it"
    for library in m["blas"]:
        assert {"internal_api", "version", "architecture", "num_threads"} <= set(library)
    assert m["python"] and m["numpy"] and m["onnxruntime"] and m["grpcio"]
    assert len(m["load"]) == 3
    text = "\n".join(header_lines(m, "python -m bench x"))
    for part in ("CPU:", "MHz" if m["mhz"]["source"] != "unknown" else "clock", "BLAS:", "kernel", "OPENBLAS_CORETYPE"):
        assert part in text
    for key in ("python", "numpy", "onnxruntime", "grpcio"):
        assert str(m[key]) in text


def test_every_run_prints_the_header_first() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = suite.run("diagnostics", ["--quick"])
    assert code == 0
    lines = out.getvalue().splitlines()
    assert lines[0] == "`python -m bench diagnostics --quick`"
    assert any(line.startswith("- CPU: ") for line in lines[:8])
    assert any(line.startswith("| (1, 1, 4, 4) |") for line in lines)


def test_the_layers_benchmark_drives_the_service_as_it_is() -> None:
    """`layers` calls the servicer and the ASGI app in process, past the sockets: a change to what they take
    (the gRPC message as the server parses it) breaks it where no server test looks, so it runs here, quickly.
    """
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = suite.run("layers", ["--quick"])
    assert code == 0
    rows = [line for line in out.getvalue().splitlines() if line.startswith("| gRPC (servicer) |")]
    assert len(rows) == 1 and float(rows[0].split("|")[2]) > 0, rows
    parts = {
        cells[1].strip(): float(cells[2])
        for cells in (line.split("|") for line in out.getvalue().splitlines())
        if len(cells) == 4 and cells[1].startswith(" the ")
    }
    assert len(parts) == 9, parts  # the gRPC form taken apart, the bare maths first
    assert all(us > 0 for name, us in parts.items() if not name.startswith("the door")), parts
    door = parts["the door (the servicer less the composed path)"]
    assert door == pytest.approx(
        parts["the servicer"] - parts["the codec and the model composed, without the door"], abs=0.11
    )
