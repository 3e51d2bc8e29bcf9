"""The start-up heap is frozen once the engines have started (ATTN_GC_FREEZE), so full collections stay short."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

# Run in a fresh interpreter: the freeze happens once per process, and the test process has its own heap.
SCRIPT = textwrap.dedent(
    """
    import gc, json, sys, threading
    from fastapi.testclient import TestClient
    from service.app import create_app
    from service.dataplane.heap import freeze_startup_heap
    from service.settings import Settings

    before = gc.get_freeze_count()
    app = create_app(Settings(enable_onnx=False, gc_freeze=sys.argv[1] == "true"))
    with TestClient(app) as client:
        for thread in threading.enumerate():
            if thread.name == "engine-startup":
                thread.join(60)
        status = client.get("/healthz").status_code
        frozen = gc.get_freeze_count()
        tracked = len(gc.get_objects())
        again = freeze_startup_heap()
    print(json.dumps({"before": before, "frozen": frozen, "tracked": tracked, "again": again, "status": status}))
    """
)


def run(freeze: str) -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, freeze], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    result: dict[str, int] = json.loads(out.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("freeze", ["true", "false"])
def test_the_startup_heap_is_frozen_once_when_asked(freeze: str) -> None:
    result = run(freeze)
    assert result["before"] == 0
    assert result["status"] == 200
    if freeze == "true":
        # modules, FastAPI's routes and schemas, the engines: tens of thousands of objects the collector skips
        assert result["frozen"] > 20_000
        assert result["tracked"] < result["frozen"] // 4  # a full collection walks only the newer objects
        assert result["again"] is False  # once per process
    else:
        assert result["frozen"] == 0
        assert result["again"] is True  # nothing froze it before
