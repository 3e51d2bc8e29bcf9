"""What ran a benchmark: the header every run prints first (``python -m bench NAME`` prints it, see
:mod:`bench.suite`), and the ``machine`` object of the benchmarks that write JSON.

Figures on this project's VMs move with the CPU model, its clock, the BLAS kernel numpy's OpenBLAS picked
(``OPENBLAS_CORETYPE`` forces one: Haswell's AVX2 kernels where AVX-512 ones exist), the versions and the
load at the start, so every run says all of them.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import statistics
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_info

ROOT = Path(__file__).resolve().parents[1]
FIELDS = (
    "when",
    "commit",
    "cpu",
    "cores",
    "usable_cores",
    "mhz",
    "blas",
    "openblas_coretype",
    "python",
    "numpy",
    "onnxruntime",
    "grpcio",
    "os",
    "load",
)
"""The keys of :func:`machine`, in the order the header prints them."""


def cpuinfo() -> tuple[str, list[float]]:
    """The CPU's model name and each logical core's clock (MHz) as ``/proc/cpuinfo`` gives them."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine(), []
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    mhz = [float(line.split(":", 1)[1]) for line in lines if line.startswith("cpu MHz")]
    return model or platform.processor() or platform.machine(), mhz


def lscpu_mhz() -> dict[str, float]:
    """``lscpu``'s clock fields (``CPU MHz``, ``CPU max MHz``, ``CPU min MHz``) where it has them (ARM, no cpuinfo
    clock), by field name.
    """
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    found = {}
    for line in out.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("CPU MHz", "CPU max MHz", "CPU min MHz"):
            try:
                found[key.strip()] = float(value)
            except ValueError:
                continue
    return found


def clock() -> dict[str, Any]:
    """The clock in MHz: from ``/proc/cpuinfo`` (mean, lowest and highest over the logical cores), else lscpu's."""
    _, mhz = cpuinfo()
    if mhz:
        return {
            "source": "/proc/cpuinfo",
            "mean": round(statistics.fmean(mhz)),
            "min": round(min(mhz)),
            "max": round(max(mhz)),
        }
    fields = lscpu_mhz()
    if fields:
        return {"source": "lscpu", **{k: round(v) for k, v in fields.items()}}
    return {"source": "unknown"}


def blas() -> list[dict[str, Any]]:
    """Each BLAS library loaded in this process (threadpoolctl): its API, version, the kernel it chose
    (``architecture``, OpenBLAS's corename) and its threads.
    """
    return [
        {
            "internal_api": info.get("internal_api"),
            "version": info.get("version"),
            "architecture": info.get("architecture"),
            "num_threads": info.get("num_threads"),
            "prefix": info.get("prefix"),
        }
        for info in threadpool_info()
        if info.get("user_api") == "blas"
    ]


def version(*distributions: str) -> str | None:
    """The installed version of the first of ``distributions`` that is installed (no import)."""
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def commit() -> str | None:
    """The checkout's commit (short), with ``+changes`` when the working tree differs from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        )
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def machine() -> dict[str, Any]:
    """What runs the benchmark, now: the keys of :data:`FIELDS`.

    ``cores`` counts the logical cores, ``usable_cores`` those this process may run on (its affinity);
    ``openblas_coretype`` is the variable as set (None when it is not); ``load`` the load average over 1, 5
    and 15 minutes.
    """
    cpu, _ = cpuinfo()
    usable: int | None
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count()
    return {
        "when": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "mhz": clock(),
        "blas": blas(),
        "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "onnxruntime": version("onnxruntime", "onnxruntime-gpu"),
        "grpcio": version("grpcio"),
        "os": f"{platform.system()} {platform.release()}",
        "load": [round(x, 2) for x in os.getloadavg()],
    }


def header_lines(m: dict[str, Any], command: str) -> list[str]:
    """The header as Markdown, ready for a page of docs/benchmarks/: the command, then one fact a line."""
    mhz = m["mhz"]
    if mhz["source"] == "/proc/cpuinfo":
        spread = "" if mhz["min"] == mhz["max"] else f" ({mhz['min']}-{mhz['max']})"
        clock_text = f"{mhz['mean']} MHz{spread} (/proc/cpuinfo)"
    elif mhz["source"] == "lscpu":
        clock_text = ", ".join(f"{k} {v}" for k, v in mhz.items() if k != "source") + " (lscpu)"
    else:
        clock_text = "clock unknown"
    libraries = "; ".join(
        f"{b['internal_api']} {b['version']}, kernel {b['architecture']}, {b['num_threads']} threads" for b in m["blas"]
    )
    coretype = m["openblas_coretype"]
    return [
        f"`{command}`",
        "",
        f"- when: {m['when']}, commit {m['commit'] or 'unknown'}",
        f"- CPU: {m['cpu']}, {m['cores']} logical cores ({m['usable_cores']} usable), {clock_text}",
        f"- BLAS: {libraries or 'none loaded'}; "
        + (f"OPENBLAS_CORETYPE={coretype}" if coretype else "OPENBLAS_CORETYPE not set"),
        f"- Python {m['python']}, numpy {m['numpy']}, onnxruntime {m['onnxruntime']}, grpcio {m['grpcio']}; {m['os']}",
        "- load average (1, 5, 15 min) at start: " + " ".join(f"{x:.2f}" for x in m["load"]),
    ]
