"""MLServer for ``python -m bench peers`` (``bench/bench_peers.py``): its venv under ``build/``, made on the first run,
its versions, and the folder ``mlserver start`` serves (settings and one model, ``attention``, whose runtime is
``bench/peers_runtime.py``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNTIME = ROOT / "bench" / "peers_runtime.py"
DEFAULT_VENV = ROOT / "build" / "mlserver-venv"
MLSERVER_SPEC = "mlserver==1.7.*"

VERSIONS = """
import json, sys, importlib.metadata as m
import numpy as np
blas = np.__config__.CONFIG.get("Build Dependencies", {}).get("blas", {})
blas = f"{blas.get('name', '?')} {blas.get('version', '')}".strip()
print(json.dumps({"python": sys.version.split()[0], "blas": blas,
    **{p: m.version(p) for p in ("mlserver", "numpy", "fastapi", "uvicorn", "grpcio")}}))
"""
"""Run by the venv's Python: its versions as JSON (numpy's BLAS as numpy's build records it)."""


def ensure_mlserver(venv: Path) -> dict[str, str]:
    """MLServer's versions in ``venv``; the venv created first (``MLSERVER_SPEC``) when it has no ``mlserver``."""
    if not (venv / "bin" / "mlserver").exists():
        python = shutil.which("python3.11") or sys.executable
        print(
            f"peers: no MLServer in {venv}: creating it once (about a minute, needs the package index):\n"
            f"  {python} -m venv {venv} && {venv}/bin/pip install '{MLSERVER_SPEC}'",
            file=sys.stderr,
            flush=True,
        )
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", MLSERVER_SPEC], check=True)
    out = subprocess.run([str(venv / "bin" / "python"), "-c", VERSIONS], capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout))


def mlserver_folder(folder: Path, http: int, grpc: int, metrics: int, workers: int) -> Path:
    """``folder`` holding MLServer's settings and one model, ``attention``, served by
    ``peers_runtime.AttentionRuntime`` (the runtime copied into the model's folder, which MLServer imports from).

    ``workers`` is MLServer's ``parallel_workers`` (0: inference in the serving process); ``debug`` false (no access
    log); metrics on ``metrics`` (MLServer's own server); its metrics and environments directories inside ``folder``,
    never in the working directory.
    """
    model = folder / "attention"
    model.mkdir(parents=True)
    shutil.copy(RUNTIME, model / RUNTIME.name)
    settings = {
        "host": "127.0.0.1",
        "http_port": http,
        "grpc_port": grpc,
        "metrics_port": metrics,
        "debug": False,
        "parallel_workers": workers,
        "metrics_dir": str(folder / "metrics"),
        "environments_dir": str(folder / "envs"),
    }
    (folder / "settings.json").write_text(json.dumps(settings, indent=2))
    (model / "model-settings.json").write_text(
        json.dumps({"name": "attention", "implementation": "peers_runtime.AttentionRuntime"})
    )
    return folder
