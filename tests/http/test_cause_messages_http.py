"""Issue 28 item 4 over HTTP: a refusal names its real cause, on both engines and both APIs.

Each case was refused with another cause's words before: ``.5`` as "no digit after sign", scores whose products
overflow while they cancel as "scores > 3.4e+38", a finite float32 mask value beyond float32 as "is inf" (and
``-1e39`` taken silently as ``-inf``, masking its position).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from tests.http.conftest import assert_problem


@pytest.fixture(scope="module")
def both() -> Iterator[TestClient]:
    """An app with both engines; waits until ONNX has loaded its graphs."""
    with TestClient(create_app(Settings()), raise_server_exceptions=False) as c:
        deadline = time.monotonic() + 60
        while c.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline, "the app never became ready"
            time.sleep(0.05)
        yield c


# ------------------------------------------------------------------ numbers JSON does not have


@pytest.mark.parametrize(
    ("written", "says"),
    [
        (".5", "'.5' at line 1 column 12 is not a JSON number: JSON numbers start with a digit (write 0.5)"),
        ("-.5", "'-.5' at line 1 column 12 is not a JSON number: JSON numbers start with a digit (write -0.5)"),
        ("+1", "'+1' at line 1 column 12 is not a JSON number: JSON numbers have no plus sign (write 1)"),
        ("007", "'007' at line 1 column 12 is not a JSON number: JSON numbers have no leading zeros (write 7)"),
        ("1.", "'1.' at line 1 column 12 is not a JSON number: JSON needs a digit after the decimal point (write 1.0)"),
        ("2e", "'2e' at line 1 column 12 is not a JSON number: JSON needs digits after the exponent"),
    ],
)
def test_a_number_json_does_not_have_is_named_with_how_to_write_it(both: TestClient, written: str, says: str) -> None:
    body = '{"query":[[' + written + ',1]],"key":[[1,0]],"value":[[1,2]]}'
    r = both.post("/v1/attention", content=body, headers={"content-type": "application/json"})
    assert_problem(r, 422, detail=f"the body is not valid JSON: {says}")
    v2 = '{"inputs":[{"name":"query","shape":[1,2],"datatype":"FP64","data":[' + written + ",1]}]}"
    r = both.post("/v2/models/attention/infer", content=v2, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert "is not a JSON number" in r.json()["error"] and f"'{written}'" in r.json()["error"], r.text


def test_other_syntax_errors_keep_the_parsers_words(both: TestClient) -> None:
    r = both.post("/v1/attention", content=b'{"query":[[1,]]}', headers={"content-type": "application/json"})
    assert_problem(r, 422, detail="the body is not valid JSON: trailing comma is not allowed")


# ------------------------------------------------------------------ scores that cancel while their products overflow

CANCELLING = {"query": [[1e20, 1e20]], "key": [[1e20, -1e20]], "value": [[1.0]], "scale": 1.0}
"""q.k = 1e40 - 1e40 = 0: the score fits float32, its two products (1e40) do not."""


@pytest.mark.parametrize("engine", ["numpy", "onnx"])
@pytest.mark.parametrize("returned", [["output"], ["output", "weights", "diagnostics"]])
def test_products_that_overflow_are_not_called_an_overflowing_score(
    both: TestClient, engine: str, returned: list[str]
) -> None:
    body = {**CANCELLING, "precision": "float32", "engine": engine, "return": returned}
    p = assert_problem(both.post("/v1/attention", json=body), 422)
    assert p["detail"] == (
        "the scores fit float32, but the products forming them overflow it: at (batch 0, head 0, query 0, key 0) "
        "the score is 0, while a term q[d] * k[d] of q.k reaches 1e+40 (beyond 3.4e+38); retry with precision "
        "float64 or scale the queries or keys down"
    )
    backward = {**body, "grad_output": [[1.0]]}
    backward.pop("return")
    assert_problem(both.post("/v1/attention/backward", json=backward), 422, detail="the products forming them overflow")
    # and float64, which the message offers, answers: the score is 0, the only key has weight 1
    r = both.post("/v1/attention", json={**body, "precision": "float64", "return": ["output", "weights"]})
    assert r.status_code == 200, r.text
    assert r.json()["output"] == [[1.0]] and r.json()["weights"] == [[1.0]]


def test_the_products_are_named_over_v2_in_its_words(both: TestClient) -> None:
    def tensor(name: str, rows: list[list[float]]) -> dict:
        return {"name": name, "shape": [len(rows), len(rows[0])], "datatype": "FP32", "data": rows}

    inputs = [tensor(n, CANCELLING[n]) for n in ("query", "key", "value")]
    r = both.post("/v2/models/attention/infer", json={"inputs": inputs, "parameters": {"scale": 1.0}})
    assert r.status_code == 400, r.text
    assert "the products forming them overflow it" in r.json()["error"] and "the FP64 datatype" in r.json()["error"]


@pytest.mark.skipif(
    np.finfo(np.longdouble).max <= np.finfo(np.float64).max, reason="long double is float64 here: no wider type"
)
@pytest.mark.parametrize("engine", ["numpy", "onnx"])
def test_float64_products_that_overflow_say_only_smaller_inputs_help(both: TestClient, engine: str) -> None:
    body = {"query": [[1e200, 1e200]], "key": [[1e200, -1e200]], "value": [[1.0]], "precision": "float64"}
    p = assert_problem(both.post("/v1/attention", json={**body, "engine": engine}), 422)
    tail = "a term q[d] * k[d] of q.k reaches 1e+400 (beyond 1.8e+308); scale the queries or keys down"
    assert p["detail"].endswith(tail), p["detail"]


@pytest.mark.parametrize("engine", ["numpy", "onnx"])
def test_an_overflowing_score_is_named_with_its_position_and_value(both: TestClient, engine: str) -> None:
    body = {
        "query": [[[1.0, 0.0], [2e19, 2e19]]],
        "key": [[[1.0, 0.0], [2e19, 2e19]]],
        "value": [[[1.0], [2.0]]],
        "precision": "float32",
        "engine": engine,
    }
    p = assert_problem(both.post("/v1/attention", json=body), 422)
    assert p["detail"].startswith(
        "the scores overflow float32: the score (scale * q.k + bias) / temperature at "
        "(batch 0, head 0, query 1, key 1) is 5.66e+38, beyond 3.4e+38; retry with precision float64 or smaller inputs"
    ), p["detail"]


# ------------------------------------------------------------------ a mask value beyond float32


@pytest.mark.parametrize("engine", ["numpy", "onnx"])
@pytest.mark.parametrize("value", [1e39, -1e39])
def test_a_mask_value_beyond_float32_is_named_not_called_inf_or_taken_as_masked(
    both: TestClient, engine: str, value: float
) -> None:
    body = {
        "query": [[1.0, 0.0]],
        "key": [[1.0, 0.0], [0.0, 1.0]],
        "value": [[1.0], [3.0]],
        "mask": [[value, value]],
        "engine": engine,
        "return": ["output", "weights"],
    }
    p = assert_problem(both.post("/v1/attention", json={**body, "precision": "float32"}), 422, loc=["mask", 0, 0])
    assert p["detail"] == f"mask[0, 0] = {value:g} overflows float32 (largest 3.40282e+38); use precision float64"
    # float64, as advised, answers: |1e39| absorbs both scores (0.707 and 0), so both keys weigh the same. Read as
    # -inf (the cast before the fix), -1e39 masked the row: zeros
    r = both.post("/v1/attention", json={**body, "precision": "float64"})
    assert r.status_code == 200, r.text
    assert r.json()["weights"] == [[0.5, 0.5]] and r.json()["output"] == [[2.0]]


def test_float32s_lowest_value_as_a_mask_still_masks_nothing_away(both: TestClient) -> None:
    lowest = float(np.finfo(np.float32).min)
    body = {"query": [[1.0, 0.0]], "key": [[1.0, 0.0], [0.0, 1.0]], "value": [[1.0], [3.0]], "mask": [[0.0, lowest]]}
    r = both.post("/v1/attention", json={**body, "precision": "float32", "return": ["weights"]})
    assert r.status_code == 200, r.text
    assert r.json()["weights"] == [[1.0, 0.0]]
