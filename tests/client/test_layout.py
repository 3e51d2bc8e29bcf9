"""The layout of the client package (``clients/python/attention_client``), checked statically as
``tests/test_layout.py`` checks the service's: no module over 400 lines, and no module takes another module's
private (underscore) names.

The client keeps its shared machinery in private modules (``_wire``, ``_requests``, ``_arguments``...), as httpx
does: a module may import a private module of the package, but what it takes from it is that module's public
names (``from attention_client import _arguments as check``, then ``check.as_int``), never ``_name``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.test_layout import MAX_LINES, private

PACKAGE = Path(__file__).resolve().parents[2] / "clients" / "python" / "attention_client"


def modules() -> dict[str, Path]:
    """Each module of the package by its dotted name."""
    found = {}
    for path in sorted(PACKAGE.glob("*.py")):
        name = "attention_client" if path.stem == "__init__" else f"attention_client.{path.stem}"
        found[name] = path
    return found


def private_uses(source: str, name: str, known: set[str]) -> Iterator[str]:
    """``from m import _x`` (where ``m._x`` is not a module of the package) and ``alias._x`` (where ``alias`` is a
    module of the package), in the module ``name``.
    """
    bound: dict[str, str] = {}
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("attention_client"):
            for alias in node.names:
                target = f"{node.module}.{alias.name}"
                if target in known:
                    bound[alias.asname or alias.name] = target  # a (private) module of the package: allowed
                elif private(alias.name):
                    yield f"{node.lineno}: from {node.module} import {alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known and alias.asname:
                    bound[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and private(node.attr)
            and isinstance(node.value, ast.Name)
            and bound.get(node.value.id, name) != name
        ):
            yield f"{node.lineno}: {node.value.id}.{node.attr} ({bound[node.value.id]}'s private name)"


def test_every_client_module_is_under_the_size_limit() -> None:
    over = [
        f"{path.name}: {n} lines"
        for path in modules().values()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    ]
    assert not over, over


def test_no_client_module_takes_another_modules_private_names() -> None:
    known = set(modules())
    problems = [
        f"{path.name}:{problem}"
        for name, path in modules().items()
        for problem in private_uses(path.read_text(encoding="utf-8"), name, known)
    ]
    assert not problems, problems


def test_the_walk_finds_private_names() -> None:
    source = """
from attention_client import _arguments as check, _wire
from attention_client._requests import _int, ATTENTION_PATH
from attention_client.errors import invalid_input
x = check._NUMERIC_KINDS, check.as_int, _wire.encode_tensor, _wire._helper
"""
    known = {"attention_client._arguments", "attention_client._wire", "attention_client._requests"}
    found = set(private_uses(source, "attention_client._session_requests", known))
    assert found == {
        "3: from attention_client._requests import _int",
        "5: check._NUMERIC_KINDS (attention_client._arguments's private name)",
        "5: _wire._helper (attention_client._wire's private name)",
    }
