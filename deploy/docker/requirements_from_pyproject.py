"""Print the requirements of pyproject.toml, one a line, for the image's dependency layer.

    python requirements_from_pyproject.py pyproject.toml [EXTRAS]

EXTRAS is comma-separated ("", "gpu", ...). The dependencies are installed in
a layer of their own, before the service code is copied, so that a code change
does not reinstall them. With the ``gpu`` extra, the CPU ``onnxruntime`` of the
base dependencies is left out: ``onnxruntime`` and ``onnxruntime-gpu`` install
the same ``onnxruntime`` package and the one installed last wins, file by file.
"""

from __future__ import annotations

import re
import sys
import tomllib


def requirement_name(requirement: str) -> str:
    """The normalized distribution name of a PEP 508 requirement."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if not match:
        raise ValueError(f"not a requirement: {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def requirements(pyproject: dict, extras: list[str]) -> list[str]:
    """The base dependencies plus those of each extra, minus CPU onnxruntime when ``gpu`` is asked for."""
    project = pyproject["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [e for e in extras if e not in optional]
    if unknown:
        raise SystemExit(f"unknown extras {unknown}; pyproject.toml has {sorted(optional)}")
    result = list(project.get("dependencies", []))
    for extra in extras:
        result += optional[extra]
    if "gpu" in extras:
        result = [r for r in result if requirement_name(r) != "onnxruntime"]
    return result


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0], "rb") as f:
        pyproject = tomllib.load(f)
    extras = [e.strip() for e in (argv[1] if len(argv) > 1 else "").split(",") if e.strip()]
    print("\n".join(requirements(pyproject, extras)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
