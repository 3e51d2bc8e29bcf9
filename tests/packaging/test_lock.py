"""The lock files: complete for the runtime set, exact, hashed, within pyproject.toml's ranges;
the runtime set is what the server imports (onnx and httpx are extras); the README's versions are the lock's.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
LOCK, GPU_LOCK = REPO / "requirements.lock", REPO / "requirements-gpu.lock"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
# Modules only the extras use: service/export (onnx, the `export` extra), service/client.py and the command
# line's remote calls (attention_client, the `client` extra, which brings httpx), service/openapi.py (PyYAML,
# for the `openapi` command's YAML, in `test`; JSON without it), tracing (`tracing`).
EXTRA_MODULES = {
    "service/export": {"onnx"},
    "service/client.py": {"attention_client"},  # the client distribution (clients/python), which brings httpx
    "service/cli/commands.py": {"attention_client"},  # --url only; --local needs no extra
    "service/cli/remote.py": {"attention_client"},
    "service/openapi.py": {"yaml"},
    "service/http/tracing.py": {"opentelemetry"},  # the `tracing` extra, imported only when on
    "service/grpc/codegen.py": {"grpc_tools"},  # regenerating the gRPC stubs: the `test` extra's grpcio-tools
}


def parse_lock(path: Path) -> dict[str, tuple[str, list[str]]]:
    """{canonical name: (version, [sha256 hashes])}."""
    entries: dict[str, tuple[str, list[str]]] = {}
    text = re.sub(r"\\\n\s*", " ", path.read_text())  # join continuation lines
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        assert not line.startswith("-"), f"{path.name}: unexpected option line {line!r}"
        match = re.fullmatch(r"([A-Za-z0-9._-]+)==([^\s;]+)\s*(?:;[^-]*)?((?:\s*--hash=sha256:[0-9a-f]{64})+)", line)
        assert match, f"{path.name}: not an exact, hashed pin: {line!r}"
        hashes = re.findall(r"sha256:([0-9a-f]{64})", match.group(3))
        entries[canonicalize_name(match.group(1))] = (match.group(2), hashes)
    return entries


def base_requirements() -> list[Requirement]:
    return [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]


@pytest.mark.parametrize("path", [LOCK, GPU_LOCK], ids=lambda p: p.name)
def test_lock_pins_every_runtime_dependency_in_range(path: Path) -> None:
    lock = parse_lock(path)
    env = default_environment()
    wanted = base_requirements()
    if path == GPU_LOCK:
        wanted = [r for r in wanted if r.name != "onnxruntime"]
        wanted += [Requirement(r) for r in PYPROJECT["project"]["optional-dependencies"]["gpu"]]
    for requirement in wanted:
        if requirement.marker is not None and not requirement.marker.evaluate(env):
            continue
        name = canonicalize_name(requirement.name)
        assert name in lock, f"{requirement} is not in {path.name} (run `make lock`)"
        assert requirement.specifier.contains(lock[name][0], prereleases=True), (requirement, lock[name][0])


def test_locks_agree_and_keep_extras_out() -> None:
    cpu, gpu = parse_lock(LOCK), parse_lock(GPU_LOCK)
    for extra_only in ("onnx", "httpx"):
        assert extra_only not in cpu and extra_only not in gpu, f"{extra_only} belongs to an extra, not the server"
    assert "onnxruntime" in cpu and "onnxruntime-gpu" not in cpu
    # Both builds install the module `onnxruntime`: the GPU image must hold only the GPU build.
    assert "onnxruntime-gpu" in gpu and "onnxruntime" not in gpu
    shared = (set(cpu) & set(gpu)) - {"onnxruntime", "onnxruntime-gpu"}
    assert {n: cpu[n][0] for n in shared} == {n: gpu[n][0] for n in shared}, "re-run `make lock` (both files)"


def third_party_imports(path: Path) -> set[str]:
    """Top-level names of the modules a file imports that are not this package or the standard library."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in {"service", "__future__"}}


def test_the_runtime_set_is_what_the_server_imports() -> None:
    lock = parse_lock(LOCK)
    declared = {canonicalize_name(r.name) for r in base_requirements()}
    distributions = packages_distributions()
    used: set[str] = set()
    for path in sorted((REPO / "service").rglob("*.py")):
        relative = path.relative_to(REPO).as_posix()
        extra = next((mods for prefix, mods in EXTRA_MODULES.items() if relative.startswith(prefix)), set())
        for module in third_party_imports(path):
            if module in extra:
                continue
            assert module not in {m for mods in EXTRA_MODULES.values() for m in mods}, (
                f"{relative} imports {module}, which only an extra installs"
            )
            dists = {canonicalize_name(d) for d in distributions.get(module, [module])}
            assert dists & set(lock), f"{relative} imports {module} ({dists}), which is not locked"
            used |= dists & declared
    # Nothing declared that the server never imports (starlette comes with fastapi, uvloop and httptools are
    # picked up by uvicorn when present).
    assert declared - used <= {"uvloop", "httptools"}, declared - used


def test_serving_never_imports_onnx_or_httpx() -> None:
    code = (
        "import sys\n"
        "from service.app import create_app\n"
        "from service.settings import Settings\n"
        "app = create_app(Settings())\n"
        "app.state.runtime.start_engines()\n"
        "assert app.state.runtime.readiness()[0], app.state.runtime.readiness()\n"
        "print(sorted(m for m in ('onnx', 'httpx', 'yaml') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout


def test_readme_versions_are_the_locks() -> None:
    """The README's "Locked versions" line names what the locks pin (GPU-only packages: the GPU lock)."""
    locks = parse_lock(GPU_LOCK) | parse_lock(LOCK)
    (line,) = [ln for ln in (REPO / "README.md").read_text().splitlines() if ln.startswith("Locked versions")]
    named = {canonicalize_name(n): v for n, v in re.findall(r"([A-Za-z][A-Za-z0-9_-]*) (\d+(?:\.\d+)+)", line)}
    assert {"onnxruntime", "numpy", "fastapi", "uvicorn", "onnxruntime-gpu"} <= set(named), line
    for name, version in named.items():
        assert locks[name][0] == version, f"README says {name} {version}; the lock has {locks[name][0]}"
