"""Every direct dependency at its declared minimum: pip constraints derived from the ``>=`` floors of
pyproject.toml (the server's dependencies and the extras named) and of the client's clients/python/pyproject.toml.

    python tests/packaging/floors.py [--extra client] > floors.txt   # then pip install -c floors.txt ...
    python tests/packaging/floors.py --check                          # the installed versions are the floors

``.ci/run`` builds a virtual environment with them and runs the smoke and end-to-end tests in it, so that a
floor that no longer works (an import that fails, a uvicorn that cannot load our protocol, an ONNX Runtime
that cannot load the graphs and silently leaves numpy serving) fails CI instead of a user's install.
Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROJECTS = (REPO / "pyproject.toml", REPO / "clients" / "python" / "pyproject.toml")
FIRST_PARTY = {"attention-service", "attention-client"}
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*([^;]*?)\s*(?:;\s*(.+))?$")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(extras: tuple[str, ...] = ("client",)) -> list[str]:
    """The direct requirements: each project's dependencies and the named extras (first-party ones left out)."""
    found: list[str] = []
    for path in PROJECTS:
        project = tomllib.loads(path.read_text())["project"]
        found += project.get("dependencies", [])
        optional = project.get("optional-dependencies", {})
        for extra in extras:
            found += optional.get(extra, [])
    return [r for r in found if canonical(_parse(r)[0]) not in FIRST_PARTY]


def _parse(requirement: str) -> tuple[str, str, str | None]:
    match = _REQUIREMENT.match(requirement)
    if not match:
        raise ValueError(f"cannot read the requirement {requirement!r}")
    name, _, specifier, marker = match.groups()
    return name, specifier, marker


def floor(requirement: str) -> tuple[str, str, str | None]:
    """``(name, minimum, marker)`` of a requirement; every direct dependency must declare a ``>=`` floor."""
    name, specifier, marker = _parse(requirement)
    minimum = re.search(r">=\s*([^,\s]+)", specifier)
    if minimum is None:
        raise ValueError(f"{requirement!r} declares no minimum (>=)")
    return canonical(name), minimum.group(1), marker


def constraints(extras: tuple[str, ...] = ("client",)) -> list[str]:
    """One ``name==floor`` line per direct dependency (the lowest floor where two projects name it)."""
    lines: dict[tuple[str, str | None], str] = {}
    for requirement in requirements(extras):
        name, minimum, marker = floor(requirement)
        key = (name, marker)
        if key in lines and _version_key(lines[key]) >= _version_key(minimum):
            continue  # the higher floor of the two (the server's numpy 2.0 over the client's 1.24) binds
        lines[key] = minimum
    return [f"{name}=={minimum}" + (f" ; {marker}" if marker else "") for (name, marker), minimum in lines.items()]


def _version_key(version: str) -> tuple[int, ...]:
    """The release numbers without trailing zeros (0.115 and 0.115.0 are one version)."""
    parts = [int(part) for part in re.findall(r"\d+", version.split("+")[0])]
    while parts and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def check(extras: tuple[str, ...] = ("client",)) -> list[str]:
    """The direct dependencies installed at another version than their floor (empty: all at their floor)."""
    wrong: list[str] = []
    for line in constraints(extras):
        spec, _, marker = line.partition(" ; ")
        name, _, minimum = spec.partition("==")
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            if not marker:  # a marker that excludes this platform may leave it out
                wrong.append(f"{name}: not installed (floor {minimum})")
            continue
        if _version_key(installed) != _version_key(minimum):
            wrong.append(f"{name}: {installed} installed, the floor is {minimum}")
    return wrong


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--extra", action="append", default=None, help="an extra whose floors to add (default client)")
    parser.add_argument("--check", action="store_true", help="exit 1 unless every direct dependency is at its floor")
    args = parser.parse_args(argv)
    extras = tuple(args.extra) if args.extra is not None else ("client",)
    if args.check:
        wrong = check(extras)
        for line in wrong:
            print(line, file=sys.stderr)
        return 1 if wrong else 0
    print("# Every direct dependency at its declared minimum (tests/packaging/floors.py).")
    print("\n".join(constraints(extras)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
