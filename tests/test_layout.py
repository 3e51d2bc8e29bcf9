"""The layout of the ``service`` package, checked statically (an AST walk; nothing is imported).

- no module is over 400 lines (the protoc output in ``service/grpc/generated/`` aside);
- the layers import downwards only: ``core``, ``engines`` and ``dataplane`` import no web or RPC framework and
  nothing of the front ends (``service.http``, ``service.grpc``); the two front ends import nothing of each other;
  ``core`` and ``engines`` import no pydantic either;
- no module uses another module's private (underscore) names, by ``from m import _name`` or ``m._name``;
- the modules import one another without a circle at import time;
- every package of ``core``, ``engines`` and ``export`` lists its modules in its docstring, one line each.

Every failure names each violation as ``file:line``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SERVICE = ROOT / "service"
GENERATED = SERVICE / "grpc" / "generated"
MAX_LINES = 400

FRAMEWORKS = ("fastapi", "starlette", "uvicorn", "grpc", "grpc_health", "grpc_reflection", "google.protobuf")
FRONT_ENDS = ("service.http", "service.grpc")
# package -> what it must not import (a module and everything under it)
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "service.core": (*FRAMEWORKS, "pydantic", *FRONT_ENDS),
    "service.engines": (*FRAMEWORKS, "pydantic", *FRONT_ENDS),
    "service.dataplane": (*FRAMEWORKS, *FRONT_ENDS),
    "service.http": ("service.grpc",),
    "service.grpc": ("service.http",),
}
DOCUMENTED_PACKAGES = ("service/core", "service/engines", "service/export")


def modules(folder: Path = SERVICE) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in modules()}
HANDWRITTEN = [p for p in modules() if GENERATED not in p.parents]


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


@dataclass(frozen=True)
class Import:
    line: int
    module: str
    """The module named, absolute (relative imports resolved)."""
    names: tuple[str, ...]
    """The names a ``from`` import takes (empty for ``import m``)."""
    aliases: tuple[tuple[str, str], ...]
    """(local name, what it is bound to, dotted) for every name the statement binds."""
    at_import_time: bool
    """At module level (also in a class body, an ``if`` or a ``try``), not in a function or under TYPE_CHECKING."""
    type_only: bool = False
    """Under ``if TYPE_CHECKING:`` at module level: an import for the type checker, which reads it as one."""

    @property
    def statement(self) -> str:
        return f"from {self.module} import {', '.join(self.names)}" if self.names else f"import {self.module}"

    @property
    def targets(self) -> list[str]:
        """The modules it loads: ``from m import n`` loads ``m.n`` where that is a module, else ``m``."""
        if not self.names:
            return [self.module]
        return [f"{self.module}.{n}" for n in self.names if f"{self.module}.{n}" in MODULES] or [self.module]


def absolute(name: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    package = name.split(".")
    if not is_package:
        package.pop()
    package = package[: len(package) - (node.level - 1)]
    return ".".join(package + ([node.module] if node.module else []))


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


@cache
def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


@cache
def imports(path: Path) -> tuple[Import, ...]:
    return imports_in(tree(path), module_name(path), path.name == "__init__.py")


def imports_in(module: ast.Module, name: str, is_package: bool) -> tuple[Import, ...]:
    """Every import of module ``name``, at any depth, each marked with whether it runs when it is imported."""
    found: list[Import] = []

    def walk(node: ast.AST, at_import_time: bool, type_only: bool = False) -> None:
        if isinstance(node, ast.Import):
            for a in node.names:
                bound = (a.asname, a.name) if a.asname else (a.name.split(".")[0], a.name.split(".")[0])
                found.append(Import(node.lineno, a.name, (), (bound,), at_import_time, type_only))
            return
        if isinstance(node, ast.ImportFrom):
            origin = absolute(name, is_package, node)
            names = tuple(a.name for a in node.names)
            aliases = tuple((a.asname or a.name, f"{origin}.{a.name}") for a in node.names)
            found.append(Import(node.lineno, origin, names, aliases, at_import_time, type_only))
            return
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            at_import_time = type_only = False  # decorators and defaults run at import time, but hold no imports
        if isinstance(node, ast.If) and is_type_checking(node.test):
            walk(node.test, at_import_time)
            for statement in node.body:
                walk(statement, False, at_import_time)
            for statement in node.orelse:
                walk(statement, at_import_time)
            return
        for child in ast.iter_child_nodes(node):
            walk(child, at_import_time, type_only)

    walk(module, True)
    return tuple(found)


def test_import_time_leaves_out_functions_and_type_checking() -> None:
    source = """
from typing import TYPE_CHECKING
import a
if TYPE_CHECKING:
    import b
else:
    import c
try:
    import d
except ImportError:
    pass
class K:
    import e
def f():
    import g
"""
    found = imports_in(ast.parse(source), "service.x", False)
    assert {i.module for i in found if i.at_import_time} == {"typing", "a", "c", "d", "e"}
    assert {i.module for i in found if not i.at_import_time} == {"b", "g"}
    assert {i.module for i in found if i.type_only} == {"b"}


def report(problems: list[str]) -> str:
    return f"{len(problems)} violation(s):\n  " + "\n  ".join(problems)


# ----------------------------------------------------------------------------------------------------- size


def test_every_module_is_under_the_size_limit() -> None:
    lengths = {rel(p): len(p.read_text(encoding="utf-8").splitlines()) for p in HANDWRITTEN}
    over = [
        f"{name}:{MAX_LINES + 1}: {n} lines, the limit is {MAX_LINES}" for name, n in lengths.items() if n > MAX_LINES
    ]
    assert not over, report(over)


# ----------------------------------------------------------------------------------------------------- layers


def test_layers_import_only_downwards() -> None:
    problems = []
    for path in HANDWRITTEN:
        name = module_name(path)
        banned = [b for package, bans in FORBIDDEN.items() if within(name, package) for b in bans]
        for imp in imports(path):
            loaded = [imp.module] + [target for _, target in imp.aliases]
            hits = sorted({b for b in banned for m in loaded if within(m, b)})
            if hits:
                problems.append(f"{rel(path)}:{imp.line}: {imp.statement} ({', '.join(hits)}: out of bounds)")
    assert not problems, report(problems)


# ----------------------------------------------------------------------------------------------------- privacy


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and (base := dotted(node.value)) is not None:
        return f"{base}.{node.attr}"
    return None


def private_uses(path: Path) -> Iterator[str]:
    name = module_name(path)
    for line, problem in private_uses_in(tree(path), name, imports(path)):
        yield f"{rel(path)}:{line}: {problem}"


def private_uses_in(module: ast.Module, name: str, found: tuple[Import, ...]) -> Iterator[tuple[int, str]]:
    bound: dict[str, str] = {}  # local name -> the service module it is
    for imp in found:
        if not within(imp.module, "service"):
            continue
        if within(imp.module, "service.grpc.generated"):
            continue  # protoc's output names its own private descriptors; taking them is how it is used
        for taken in imp.names:
            if private(taken) and f"{imp.module}.{taken}" != name:
                yield imp.line, f"from {imp.module} import {taken}"
        for local, target in imp.aliases:
            if target in MODULES:
                bound[local] = target
    for node in ast.walk(module):
        if isinstance(node, ast.Attribute) and private(node.attr) and (chain := dotted(node.value)):
            head, _, rest = chain.partition(".")
            target = f"{bound[head]}.{rest}" if head in bound and rest else bound.get(head, "")
            if target in MODULES and target != name:
                yield node.lineno, f"{chain}.{node.attr} ({target}'s private name)"


def test_no_module_uses_another_modules_private_names() -> None:
    problems = [problem for path in HANDWRITTEN for problem in private_uses(path)]
    assert not problems, report(problems)


# ------------------------------------------------------------------------------------------- declared members

PROBED = ("engine", "engines", "fallback", "first", "onnx", "settings")
"""Names that hold an engine or the settings: what is asked of them is declared (service/engines/base.py), never
probed with ``getattr`` (issue 29 item 2)."""


def probes(module: ast.Module) -> Iterator[tuple[int, str]]:
    """``getattr(x, ...)`` and ``hasattr(x, ...)`` where ``x`` names an engine or the settings."""
    for node in ast.walk(module):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args):
            continue
        if node.func.id not in ("getattr", "hasattr"):
            continue
        target = node.args[0]
        name = target.id if isinstance(target, ast.Name) else target.attr if isinstance(target, ast.Attribute) else ""
        if name in PROBED:
            yield node.lineno, f"{node.func.id}({ast.unparse(target)}, ...)"


def test_engines_and_settings_are_not_probed_with_getattr() -> None:
    problems = [
        f"{rel(path)}:{line}: {what}" for path in HANDWRITTEN for line, what in probes(ast.parse(path.read_text()))
    ]
    assert not problems, report(problems)


def test_the_probe_walk_finds_probes() -> None:
    source = "getattr(engine, 'cost', None)\nhasattr(self.settings, 'x')\ngetattr(record, 'request_id')\n"
    assert [what for _, what in probes(ast.parse(source))] == [
        "getattr(engine, ...)",
        "hasattr(self.settings, ...)",
    ]


def test_the_privacy_walk_finds_private_names() -> None:
    source = """
from . import forward, _shared
from .forward import _prepare, __all__
from service.core import masks as m
import service.core.types
from service.grpc.generated import inference_pb2 as pb, _generated_private
def f():
    from service.core.analysis import _lazy
    return m._bias, service.core.types._check, pb._descriptor, m.public, forward._step
"""
    name = "service.core.attention.prepared"
    module = ast.parse(source)
    found = {problem for _, problem in private_uses_in(module, name, imports_in(module, name, False))}
    assert found == {
        "from service.core.attention import _shared",
        "from service.core.attention.forward import _prepare",
        "from service.core.analysis import _lazy",
        "m._bias (service.core.masks's private name)",
        "service.core.types._check (service.core.types's private name)",
        "forward._step (service.core.attention.forward's private name)",
    }


# ----------------------------------------------------------------------------------------------------- circles


def import_graph(type_only: bool = False) -> dict[str, dict[str, int]]:
    """Each module's edges, {the module it loads when imported: the line}, from its module-level imports (with
    ``type_only``, those under ``if TYPE_CHECKING:`` too: a type checker and an import graph read them as edges).

    Loading ``a.b.c`` runs ``a/__init__.py`` and ``a/b/__init__.py`` first, so those are edges too; a module's own
    parent packages are not: Python has started them before the module itself.
    """
    graph: dict[str, dict[str, int]] = {}
    for name, path in MODULES.items():
        edges: dict[str, int] = {}
        for imp in imports(path):
            if not (imp.at_import_time or (type_only and imp.type_only)):
                continue
            for target in imp.targets:
                parts = target.split(".")
                for n in range(1, len(parts) + 1):
                    loaded = ".".join(parts[:n])
                    if loaded in MODULES and loaded != name and not within(name, loaded):
                        edges.setdefault(loaded, imp.line)
        graph[name] = edges
    return graph


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One circle per strongly connected component of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for dep in sorted(graph[node]):
            if dep not in index:
                connect(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)

    found = []
    for component in components:  # a shortest path back to the start, through the component only
        start, members = component[0], set(component)
        paths = {start: [start]}
        queue = [start]
        while queue:
            node = queue.pop(0)
            for dep in sorted(graph[node]):
                if dep == start:
                    found.append(paths[node] + [start])
                    queue = []
                    break
                if dep in members and dep not in paths:
                    paths[dep] = paths[node] + [dep]
                    queue.append(dep)
    return found


@pytest.mark.parametrize("type_only", [False, True], ids=["at-import-time", "type-only-too"])
def test_modules_import_one_another_without_a_circle(type_only: bool) -> None:
    graph = import_graph(type_only)
    problems = []
    for circle in circles(graph):
        steps = [f"{rel(MODULES[a])}:{graph[a][b]} imports {b}" for a, b in zip(circle, circle[1:], strict=False)]
        problems.append("import circle: " + "; ".join(steps))
    assert not problems, report(problems)


def test_the_circle_finder_finds_circles() -> None:
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3, "d": 4}, "d": {}}
    assert circles(graph) == [["a", "b", "c", "a"]]
    assert circles({"a": {"b": 1}, "b": {}}) == []


# ----------------------------------------------------------------------------------------------------- docstrings


@pytest.mark.parametrize(
    "package",
    [p.parent for folder in DOCUMENTED_PACKAGES for p in modules(ROOT / folder) if p.name == "__init__.py"],
    ids=lambda p: rel(p),
)
def test_every_package_docstring_lists_its_modules(package: Path) -> None:
    doc = ast.get_docstring(tree(package / "__init__.py")) or ""
    assert "Layout:" in doc, package
    inside = [p.stem for p in package.glob("*.py") if p.name != "__init__.py"]
    inside += [p.parent.name for p in package.glob("*/__init__.py")]
    for module in sorted(inside):
        assert f"- ``{module}``:" in doc, f"{package.name}'s docstring does not list {module}"
