"""The layout of the maths packages (service/core, service/engines, service/export), checked statically.

Every module stays under 400 lines; no module uses another module's private (underscore) names; the core's
modules import one another without a circle; neither the core nor the engines import a web framework; and
every package's docstring lists its modules, one line each.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("service/core", "service/engines", "service/export")
MAX_LINES = 400
WEB_FRAMEWORKS = ("fastapi", "starlette", "uvicorn", "grpc", "pydantic")


def modules(*packages: str) -> list[Path]:
    return sorted(p for pkg in packages for p in (ROOT / pkg).rglob("*.py") if "__pycache__" not in p.parts)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module imported, names taken from it) for every import in ``path``, at any depth."""
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, [alias.name for alias in node.names]))
    return found


@pytest.mark.parametrize("path", modules(*PACKAGES), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_is_under_the_size_limit(path: Path) -> None:
    assert len(path.read_text().splitlines()) < MAX_LINES


@pytest.mark.parametrize("path", modules(*PACKAGES), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_uses_another_modules_private_names(path: Path) -> None:
    service_modules: dict[str, str] = {}  # local alias -> imported service module
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("service"):
            private = [a.name for a in node.names if a.name.startswith("_")]
            assert not private, f"{path.name} imports {private} from {node.module}"
            for a in node.names:  # a submodule taken by name: ``from service.core import normalizers``
                service_modules[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("service"):
                    service_modules[a.asname or a.name.split(".")[0]] = a.name
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in service_modules
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            raise AssertionError(f"{path.name} uses {node.value.id}.{node.attr}")


def test_core_imports_have_no_circle() -> None:
    """Edges follow what Python imports: ``from M import n`` imports the module ``M.n`` where there is one, else
    ``M`` (a package's ``__init__``, which imports its own modules). A module's import of its own parent packages
    adds no edge: Python has always started those before the module itself.
    """
    names = {module_name(p): p for p in modules("service/core")}
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        deps: set[str] = set()
        for module, taken in imports(path):
            targets = [f"{module}.{t}" for t in taken if f"{module}.{t}" in names] or [module]
            deps |= {t for t in targets if t in names and t != name and not name.startswith(t + ".")}
        graph[name] = deps
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                raise AssertionError("import circle: " + " -> ".join(path[path.index(dep) :] + [dep]))
            if dep not in state:
                visit(dep, path + [dep])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


@pytest.mark.parametrize("path", modules("service/core", "service/engines"), ids=lambda p: str(p.relative_to(ROOT)))
def test_core_and_engines_import_no_web_framework(path: Path) -> None:
    for module, _ in imports(path):
        assert module.split(".")[0] not in WEB_FRAMEWORKS, f"{path.name} imports {module}"


@pytest.mark.parametrize(
    "package",
    [p.parent for p in modules(*PACKAGES) if p.name == "__init__.py"],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_every_package_docstring_lists_its_modules(package: Path) -> None:
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    assert "Layout:" in doc, package
    inside = [p.stem for p in package.glob("*.py") if p.name != "__init__.py"]
    inside += [p.parent.name for p in package.glob("*/__init__.py")]
    for module in sorted(inside):
        assert f"- ``{module}``:" in doc, f"{package.name}'s docstring does not list {module}"
