"""/v2 JSON ``data`` (issue 28): the nesting the protocol allows, and the float range of FP32 and FP16.

Nested ``data`` is the tensor's own nested form or flat (row-major), nothing in between: a matrix sent as its
transpose was read again in row-major order and answered with a wrong output. A float datatype takes every number
that rounds to one of its finite values (-3.4028235e+38 is how numpy, Go and Rust print float32's lowest value).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.dataplane.errors import ServiceError
from service.dataplane.inference import TensorSpec
from service.dataplane.tensors import TensorLimits
from service.http.v2.tensors import parse_request
from service.settings import Settings

INFER = "/v2/models/attention/infer"
PAD = 40 << 10  # whitespace that takes a body past the small-body parser: its data is read from the bytes

# The issue's body: key declared [3, 2] and nested as its transpose.
MISNESTED: dict[str, Any] = {
    "inputs": [
        {"name": "query", "shape": [1, 2], "datatype": "FP64", "data": [1.0, 2.0]},
        {"name": "key", "shape": [3, 2], "datatype": "FP64", "data": [[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]]},
        {"name": "value", "shape": [3, 2], "datatype": "FP64", "data": [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]},
    ]
}
KEY = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]

FP32_ROUNDS_UP = 2.0**128 - 2.0**103  # halfway to 2**128: rounds (to even) to an infinity in float32
FP16_ROUNDS_UP = 2.0**16 - 2.0**4  # 65520, halfway between 65504 and 65536


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    app = create_app(Settings(enable_onnx=False))
    with TestClient(app, raise_server_exceptions=False) as c:
        deadline = time.monotonic() + 10
        while c.get("/v2/health/ready").status_code != 200:
            assert time.monotonic() < deadline, "the app never became ready"
            time.sleep(0.01)
        yield c


def post(client: TestClient, body: dict[str, Any], pad: bool):
    raw = json.dumps(body).encode() + (b" " * PAD if pad else b"")
    return client.post(INFER, content=raw, headers={"Content-Type": "application/json"})


def error(r) -> str:
    assert r.status_code == 400, r.text
    return r.json()["error"]


def with_key(data: Any) -> dict[str, Any]:
    body = json.loads(json.dumps(MISNESTED))
    body["inputs"][1]["data"] = data
    return body


@pytest.mark.parametrize("pad", [False, True], ids=["small-body", "large-body"])
def test_the_issues_transposed_key_is_refused_naming_the_nesting(client: TestClient, pad: bool) -> None:
    message = error(post(client, MISNESTED, pad))
    assert "'key'" in message and "[3, 2]" in message and "nested as [2, 3]" in message, message


@pytest.mark.parametrize("pad", [False, True], ids=["small-body", "large-body"])
def test_an_extra_level_of_nesting_is_refused(client: TestClient, pad: bool) -> None:
    message = error(post(client, with_key([KEY]), pad))
    assert "'key'" in message and "[3, 2]" in message and "nested as [1, 3, 2]" in message, message


@pytest.mark.parametrize("pad", [False, True], ids=["small-body", "large-body"])
def test_flat_and_exactly_nested_data_give_the_same_output(client: TestClient, pad: bool) -> None:
    flat = post(client, with_key([x for row in KEY for x in row]), pad)
    nested = post(client, with_key(KEY), pad)
    assert flat.status_code == 200 and nested.status_code == 200, (flat.text, nested.text)
    out_flat, out_nested = flat.json()["outputs"][0], nested.json()["outputs"][0]
    assert out_flat["name"] == "output" and out_flat["data"] == out_nested["data"]
    # The rows as declared: scores [1, 2, 3] (scaled by 1/sqrt(2)), not the re-read rows [1,0], [1,0], [1,1].
    scores = np.array([1.0, 2.0, 3.0]) / np.sqrt(2.0)
    weights = np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()
    np.testing.assert_allclose(out_flat["data"], weights @ np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]), rtol=1e-6)


def test_fp32_lowest_as_printed_is_a_mask_value_as_on_v1(client: TestClient) -> None:
    lowest = -3.4028235e38  # str(np.finfo(np.float32).min): beyond -float(np.finfo(np.float32).max) as a double
    q, v, mask = [[1.0, 2.0]], [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], [[0.0, lowest, 0.0]]

    def tensor(name: str, rows: list[list[float]]) -> dict[str, Any]:
        return {"name": name, "shape": [len(rows), len(rows[0])], "datatype": "FP32", "data": sum(rows, [])}

    body = {"inputs": [tensor("query", q), tensor("key", KEY), tensor("value", v), tensor("mask", mask)]}
    r2 = post(client, body, pad=False)
    assert r2.status_code == 200, r2.text
    r1 = client.post("/v1/attention", json={"query": q, "key": KEY, "value": v, "mask": mask})
    assert r1.status_code == 200, r1.text
    out = {o["name"]: o for o in r2.json()["outputs"]}
    assert out["output"]["datatype"] == "FP32"
    np.testing.assert_array_equal(np.array(out["output"]["data"]).reshape(1, 2), np.array(r1.json()["output"]))
    assert r1.json()["weights"][0][1] == 0.0


@pytest.mark.parametrize("value", [FP32_ROUNDS_UP, 3.4028236e38, -3.4028236e38, 1e39])
def test_fp32_past_the_rounding_boundary_is_refused_naming_the_value(client: TestClient, value: float) -> None:
    body = with_key([x for row in KEY for x in row])
    body["inputs"][1]["datatype"] = "FP32"
    body["inputs"][1]["data"][3] = value
    message = error(post(client, body, pad=False))
    assert f"input 'key': data[3] = {value!r} overflows FP32" in message, message


LIMITS = TensorLimits(max_rank=4, max_dim=1 << 20, max_elements=1 << 24)
SPEC = TensorSpec("x", ("FP16", "FP32", "FP64"), min_rank=1)


def parse(data: list[float], datatype: str) -> np.ndarray:
    obj = {"inputs": [{"name": "x", "shape": [len(data)], "datatype": datatype, "data": data}]}
    return parse_request(obj, memoryview(b""), model="m", inputs=[SPEC], outputs=["y"], limits=LIMITS).inputs["x"]


@pytest.mark.parametrize("size", [4, 65, 1000])  # the tiny-tensor check in Python, numpy's past 64 values
@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize(
    "datatype, dtype, boundary", [("FP32", np.float32, FP32_ROUNDS_UP), ("FP16", np.float16, FP16_ROUNDS_UP)]
)
def test_what_rounds_to_a_finite_value_is_accepted_and_no_more(
    size: int, sign: float, datatype: str, dtype: type[np.floating], boundary: float
) -> None:
    largest = float(np.finfo(dtype).max)
    below = float(np.nextafter(boundary, 0.0))  # the largest double that rounds to the largest finite value
    with np.errstate(over="ignore"):
        assert dtype(below) == largest and np.isinf(dtype(boundary))
    data = [0.5] * size
    for fits in (largest, below):
        data[-1] = sign * fits
        got = parse(data, datatype)[-1]
        assert got == sign * fits and dtype(got) == sign * largest
    for over in (boundary, float(np.nextafter(boundary, np.inf))):
        data[-1] = sign * over
        with pytest.raises(ServiceError) as caught:
            parse(data, datatype)
        assert caught.value.message.startswith(f"input 'x': data[{size - 1}] = {sign * over!r} overflows {datatype}")
