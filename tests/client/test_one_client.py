"""The sync client is generated from the async one (clients/python/scripts/unasync.py) and stays in step."""

from __future__ import annotations

import importlib.util
import inspect
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from attention_client import AsyncAttentionClient, AttentionClient

SCRIPT = Path(__file__).resolve().parents[2] / "clients" / "python" / "scripts" / "unasync.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("unasync", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_regenerating_the_sync_client_gives_the_committed_file() -> None:
    unasync = _script()
    assert unasync.TARGET.read_text() == unasync.unasync(unasync.SOURCE.read_text()), (
        "client.py is out of date: run python clients/python/scripts/unasync.py"
    )
    done = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_the_check_fails_on_a_hand_edit(tmp_path: Path) -> None:
    unasync = _script()
    generated = unasync.unasync(unasync.SOURCE.read_text())
    assert "async " not in generated and "await " not in generated and "asyncio" not in generated
    assert "AsyncAttentionClient" not in generated and "httpx.Async" not in generated
    unasync.TARGET = tmp_path / "client.py"
    unasync.TARGET.write_text(generated + "# edited by hand\n")
    assert unasync.main(["--check"]) == 1
    assert unasync.main([]) == 0 and unasync.TARGET.read_text() == generated
    assert unasync.main(["--check"]) == 0


def _public(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in vars(cls).items()
        if callable(member) and (not name.startswith("_") or name == "__init__")
    }


def test_both_clients_have_the_same_methods_and_parameters() -> None:
    sync, asynchronous = _public(AttentionClient), _public(AsyncAttentionClient)
    assert sync.keys() == asynchronous.keys()
    for name, signature in sync.items():
        assert list(signature.parameters) == list(asynchronous[name].parameters), name
        defaults = [p.default for p in signature.parameters.values()]
        assert defaults == [p.default for p in asynchronous[name].parameters.values()], name
    for name in sync:
        if name != "__init__":
            assert inspect.iscoroutinefunction(getattr(AsyncAttentionClient, name)), name
            assert not inspect.iscoroutinefunction(getattr(AttentionClient, name)), name


def test_every_public_method_documents_each_parameter() -> None:
    for cls in (AttentionClient, AsyncAttentionClient):
        for name, signature in _public(cls).items():
            doc = inspect.getdoc(getattr(cls, name)) or ""
            assert doc, f"{cls.__name__}.{name} has no docstring"
            for parameter in list(signature.parameters)[1:]:
                assert f"\n    {parameter}: " in doc, f"{cls.__name__}.{name} does not document {parameter!r}"
