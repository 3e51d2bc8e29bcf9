"""The cost model on a live server (issue 21, item 15): the work cap holds on this machine (a request the reference
model admits near the cap either runs within the cap's time, plus a quarter, or is refused when this machine is
slower than the reference), and /v2 prices binary outputs at their raw size, not as JSON.
"""

from __future__ import annotations

import base64

import httpx
import numpy as np
import orjson
import pytest

from service.core.attention import Dims
from service.engines import cost
from tests.hardening.test_connections import server_cpu_s

pytestmark = pytest.mark.slow  # starts live servers

CAP_FLOPS = 5e10
"""A work cap of one core-second (ATTN_MAX_WORK_FLOPS), so that the test's request costs about that."""


@pytest.mark.parametrize("normalizer", ["sparsemax", "entmax15"])
def test_the_work_cap_holds_on_this_machine(live_server, normalizer: str) -> None:  # type: ignore[no-untyped-def]
    # The largest L = S that the reference model admits under the cap: what the uncalibrated service ran.
    n = 1024
    while cost.REFERENCE.numpy_cost(
        Dims(B=1, Hq=1, Hkv=1, L=n + 256, S=n + 256, E=1, Ev=1),
        normalizer=normalizer, alpha=None, dtype="float32", need_weights=False, need_scores=False,
    ).work_flops < CAP_FLOPS:  # fmt: skip
        n += 256
    server = live_server({"ATTN_COST_CALIBRATION": "auto", "ATTN_MAX_WORK_FLOPS": str(CAP_FLOPS)})
    assert "cost model calibrated" in server.log()
    rng = np.random.default_rng(0)
    col = rng.uniform(0.0, 0.1, (1, 1, n, 1)).astype("<f4")  # every key a candidate: the worst case
    enc = {"shape": list(col.shape), "dtype": "float32", "b64": base64.b64encode(col.tobytes()).decode()}
    body = {"query": enc, "key": enc, "value": enc, "normalizer": normalizer, "return": ["output"]}
    cpu0 = server_cpu_s(server.proc.pid)
    r = httpx.post(server.url + "/v1/attention", json=body, timeout=120)
    used = server_cpu_s(server.proc.pid) - cpu0
    if r.status_code == 413:  # this machine is slower than the reference at this kernel: refused at once
        assert "core-seconds" in r.json()["detail"] and used < 0.5, (r.text, used)
    else:
        assert r.status_code == 200, r.text
        assert used <= 1.25 * CAP_FLOPS / cost.REFERENCE_GEMM_FLOPS_PER_S + 0.2, (n, used)


def test_settings_take_explicit_factors(live_server) -> None:  # type: ignore[no-untyped-def]
    """Pinned factors (as serve hands its workers) scale the estimates: x4 refuses what x1 admits."""
    col = [[0.01]] * 512
    body = {"query": col, "key": col, "value": col, "normalizer": "sparsemax", "return": ["output"]}
    cap = str(512 * 512 * 16e-9 * 50e9 * 2)  # twice the reference estimate
    plain = live_server({"ATTN_MAX_WORK_FLOPS": cap})
    assert httpx.post(plain.url + "/v1/attention", json=body).status_code == 200
    pinned = live_server({"ATTN_MAX_WORK_FLOPS": cap, "ATTN_COST_CALIBRATION": "sparsemax=4"})
    r = httpx.post(pinned.url + "/v1/attention", json=body)
    assert r.status_code == 413 and "estimated work" in r.json()["detail"]


def binary_outputs(shape: tuple[int, ...], binary: bool) -> tuple[bytes, dict[str, str]]:
    q = np.zeros(shape, dtype="<f4")
    header = orjson.dumps(
        {
            "inputs": [
                {"name": n, "shape": list(shape), "datatype": "FP32", "parameters": {"binary_data_size": q.nbytes}}
                for n in ("query", "key", "value")
            ],
            "outputs": [{"name": n, "parameters": {"binary_data": binary}} for n in ("output", "weights")],
            "parameters": {"diagnostics": False},
        }
    )
    return header + q.tobytes() * 3, {"inference-header-content-length": str(len(header))}


def test_binary_outputs_are_priced_at_their_raw_size(live_server) -> None:  # type: ignore[no-untyped-def]
    """(1, 16, 1000, 160) with output and weights as binary is 74 MB: answered; as JSON it would be about 297 MB,
    over the 256 MB response limit (it was refused as binary too).
    """
    server = live_server()
    body, headers = binary_outputs((1, 16, 1000, 160), binary=True)
    r = httpx.post(server.url + "/v2/models/attention/infer", content=body, headers=headers, timeout=120)
    assert r.status_code == 200, r.text[:300]
    assert len(r.content) > 70_000_000
    body, headers = binary_outputs((1, 16, 1000, 160), binary=False)
    r = httpx.post(server.url + "/v2/models/attention/infer", content=body, headers=headers, timeout=120)
    assert r.status_code == 413 and "estimated response size" in r.json()["error"]
