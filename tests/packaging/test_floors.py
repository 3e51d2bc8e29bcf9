"""The dependency floors are true: every direct dependency declares one (tests/packaging/floors.py turns them into
constraints for .ci/run's floors job), and a server started as production starts it, with ONNX required, serves
attention on ONNX Runtime (the smoke that job runs with every dependency at its floor; here, at the lock's).
"""

from __future__ import annotations

import json
import re
import tomllib
import urllib.request

import numpy as np
import pytest

from tests.e2e.conftest import ROOT, free_port, started
from tests.packaging import floors


def test_every_direct_dependency_declares_a_floor() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = [*project["dependencies"], *project["optional-dependencies"]["client"]]
    names = {floors.canonical(re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0]) for r in declared} - floors.FIRST_PARTY
    pinned = {line.split("==")[0] for line in floors.constraints()}
    assert names <= pinned, names - pinned
    assert {"httpx", "numpy"} <= pinned, "the client's own dependencies are direct ones too"
    for line in floors.constraints():
        name, _, rest = line.partition("==")
        version = rest.split(" ; ")[0]
        assert re.fullmatch(r"\d+(\.\d+)*", version), line
    numpy = next(line for line in floors.constraints() if line.startswith("numpy=="))
    assert numpy.startswith("numpy==2."), "the server's numpy floor binds, not the client's lower one"


def test_floors_derivation_refuses_a_dependency_without_a_minimum() -> None:
    with pytest.raises(ValueError, match="declares no minimum"):
        floors.floor("somepackage<2")
    assert floors.floor("uvloop>=0.19,<1; sys_platform != 'win32'") == ("uvloop", "0.19", "sys_platform != 'win32'")


@pytest.mark.slow
def test_served_on_onnx_with_onnx_required() -> None:
    """``python -m service serve`` with ATTN_ONNX_REQUIRED=true: ready only once ONNX Runtime has loaded the
    graphs, and an attention request asked of the onnx engine is answered by it, with numpy's numbers.
    """
    from attention_client import AttentionClient

    from service.core.attention import attention
    from service.core.types import AttentionParams

    host, port = "127.0.0.1", free_port()
    env = {"ATTN_ENABLE_ONNX": "true", "ATTN_ONNX_REQUIRED": "true", "ATTN_LOG_LEVEL": "warning"}
    env["ATTN_GRPC_PORT"] = "0"  # gRPC on a free port, not 8001 (another server may hold it)
    args = ["-m", "service", "serve", "--host", host, "--port", str(port)]
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((1, 2, 5, 8)) for _ in range(3))
    with started(args, port, env, host) as server, AttentionClient(server.url, timeout=30) as client:
        with urllib.request.urlopen(server.url + "/readyz", timeout=10) as answer:
            ready = json.loads(answer.read())
        assert ready["engines"] == {"numpy": True, "onnx": True} and "onnx" in ready["required"], ready
        for precision, tol in (("float32", 1e-5), ("float64", 1e-10)):
            r = client.attention(q, k, v, engine="onnx", precision=precision, causal=True)
            assert r.engine.name == "onnx", r.engine
            want = attention(q, k, v, params=AttentionParams(causal="top_left"), dtype=np.float64)
            np.testing.assert_allclose(r.output, want.output, atol=tol, rtol=tol)
        grads = client.attention_backward(q, k, v, np.ones_like(v), engine="onnx", precision="float64")
        assert grads.engine.name == "onnx" and grads.grad_query.shape == q.shape
