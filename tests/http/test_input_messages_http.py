"""Refused input over HTTP (issue 13, items 7 to 9): ambiguous masks, out-of-range key lengths, and messages
that name the field, the index and the real cause, on /v1 and /v2, with either JSON parser.
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
from service.http.codecs import jsonbody
from service.settings import Settings
from tests.http.conftest import assert_problem

BASE: dict[str, Any] = {"query": [[1.0, 0.0]], "key": [[1.0, 0.0], [0.0, 1.0]], "value": [[1.0], [2.0]]}
V2 = "/v2/models/attention/infer"


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(create_app(Settings(enable_onnx=False)), raise_server_exceptions=False) as c:
        deadline = time.monotonic() + 10
        while c.get("/v2/health/ready").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        yield c


@pytest.fixture(params=["orjson", "simdjson"], autouse=True)
def parser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every case with both parsers: orjson (small bodies) and simdjson with its fallbacks (large bodies)."""
    monkeypatch.setattr(jsonbody, "SIMDJSON_MIN_BYTES", 1 << 40 if request.param == "orjson" else 0)
    return str(request.param)


def post_v1(client: TestClient, raw: bytes, path: str = "/v1/attention") -> Any:
    return client.post(path, content=raw, headers={"content-type": "application/json"})


def v1(client: TestClient, **fields: Any) -> Any:
    return post_v1(client, json.dumps({**BASE, **fields}).encode())


def v2(client: TestClient, *extra: dict[str, Any], query: dict[str, Any] | None = None) -> Any:
    inputs = [
        query or {"name": "query", "shape": [1, 2], "datatype": "FP64", "data": [1.0, 0.0]},
        {"name": "key", "shape": [2, 2], "datatype": "FP64", "data": [1.0, 0.0, 0.0, 1.0]},
        {"name": "value", "shape": [2, 1], "datatype": "FP64", "data": [1.0, 2.0]},
        *extra,
    ]
    return client.post(
        V2, content=json.dumps({"inputs": inputs}).encode(), headers={"content-type": "application/json"}
    )


def v2_error(r: Any, *fragments: str) -> str:
    assert r.status_code == 400, r.text
    message = r.json()["error"]
    for fragment in fragments:
        assert fragment in message, message
    return str(message)


# ------------------------------------------------------------------ item 7: ambiguous masks


def test_v1_mask_mixing_booleans_and_numbers_is_ambiguous(client: TestClient) -> None:
    p = assert_problem(v1(client, mask=[False, 0.0]), 422, loc=["mask", 1])
    assert "mask mixes booleans and numbers (mask[0] is the boolean false, mask[1] is 0.0)" in p["detail"]
    assert "send only booleans" in p["detail"] and "or only numbers" in p["detail"]
    assert_problem(v1(client, mask=[[0.5, True], [0.0, 0.0]]), 422, loc=["mask", 0, 1], detail="ambiguous")


def test_v1_mask_of_integers_0_and_1_is_ambiguous(client: TestClient) -> None:
    p = assert_problem(v1(client, mask=[[1, 0]]), 422, loc=["mask"])
    assert "only the integers 0 and 1, which is ambiguous" in p["detail"] and "send booleans" in p["detail"]
    query = [[1.0, 0.0], [0.0, 1.0]]
    assert_problem(v1(client, query=query, mask=[[1, 0], [0, 1]]), 422, loc=["mask"], detail="ambiguous")
    assert_problem(post_v1(client, b'{"logits": [1.0, 2.0], "mask": [1, 0]}', "/v1/softmax"), 422, loc=["mask"])


def test_v1_unambiguous_masks_still_work(client: TestClient) -> None:
    booleans = v1(client, mask=[True, False])
    assert booleans.status_code == 200 and booleans.json()["weights"] == [[1.0, 0.0]]
    floats = v1(client, mask=[1.0, 0.0], precision="float64")  # written with a decimal point: additive
    w = np.array(floats.json()["weights"])
    p = 1 / (1 + np.exp(-(1 / np.sqrt(2) + 1)))  # softmax of [1/sqrt(2) + 1, 0 + 0]
    np.testing.assert_allclose(w, [[p, 1 - p]], rtol=1e-12)
    additive = v1(client, mask=[0, -1000000000])  # integers other than 0 and 1 can only be additive
    assert additive.status_code == 200 and additive.json()["weights"] == [[1.0, 0.0]]


def test_v2_mask_datatype_decides(client: TestClient) -> None:
    """/v2 declares the datatype: BOOL data must be true/false, FP data numbers (integers read as floats)."""
    fp_ints = v2(client, {"name": "mask", "shape": [2], "datatype": "FP64", "data": [0, -1000]})
    assert fp_ints.status_code == 200, fp_ints.text
    v2_error(
        v2(client, {"name": "mask", "shape": [2], "datatype": "FP64", "data": [False, 0.0]}),
        "input 'mask'",
        "data[0] must be a number, got the boolean false",
    )
    v2_error(
        v2(client, {"name": "mask", "shape": [2], "datatype": "BOOL", "data": [True, 0]}),
        "input 'mask'",
        "data[1] must be true or false, got 0",
    )


# ------------------------------------------------------------------ item 8: key_lengths out of range


@pytest.mark.parametrize("length", [2**63, 2**64 - 1, 2**64, 2**70])
def test_v1_key_lengths_beyond_int64_are_out_of_range(client: TestClient, length: int) -> None:
    p = assert_problem(v1(client, key_lengths=[length]), 422, loc=["key_lengths", 0], detail="is out of range")
    assert str(length) in p["detail"]


@pytest.mark.parametrize("length", [2**63, 2**64 - 1, 2**64])
def test_v2_key_lengths_beyond_int64_are_out_of_range(client: TestClient, length: int) -> None:
    r = v2(client, {"name": "key_lengths", "shape": [1], "datatype": "INT64", "data": [length]})
    v2_error(r, "input 'key_lengths'", f"data[0] = {length}", "out of range")


# ------------------------------------------------------------------ item 9: messages


def test_literal_nan_names_the_field_and_says_json_has_none(client: TestClient) -> None:
    raw = b'{"query": [[1.0, NaN]], "key": [[1.0, 0.0], [0.0, 1.0]], "value": [[1.0], [2.0]]}'
    p = assert_problem(post_v1(client, raw), 422, loc=["query", 0, 1])
    assert "query[0, 1] is NaN, which JSON does not have" in p["detail"]
    raw = b'{"logits": {"shape": [2], "dtype": "float32", "data": [1.0, -Infinity]}}'
    p = assert_problem(post_v1(client, raw, "/v1/softmax"), 422, loc=["logits", "data", 1])
    assert "logits.data[1] is -Infinity" in p["detail"]
    p = assert_problem(post_v1(client, b'{"query": [[1e999]]}'), 422, loc=["query", 0, 0])
    assert "query[0, 0] = 1e999 is beyond the range of float64" in p["detail"]
    body = b'{"inputs": [{"name": "query", "shape": [1, 2], "datatype": "FP32", "data": [1.0, NaN]}]}'
    r = client.post(V2, content=body, headers={"content-type": "application/json"})
    v2_error(r, "input 'query': data[1] is NaN, which JSON does not have")


def test_string_nan_is_not_a_number(client: TestClient) -> None:
    p = assert_problem(v1(client, query=[[1.0, "NaN"]]), 422, loc=["query", 0, 1])
    assert "query[0, 1] must be a number, got the string 'NaN'" in p["detail"] and "got 'U'" not in p["detail"]
    assert "JSON has no NaN" in p["detail"]
    query = {"name": "query", "shape": [1, 2], "datatype": "FP64", "data": [1.0, "NaN"]}
    v2_error(v2(client, query=query), "input 'query'", "data[1] must be a number, got the string 'NaN'")


def test_ragged_arrays_are_named_in_the_services_words(client: TestClient) -> None:
    p = assert_problem(v1(client, query=[[1.0, 0.0], [3.0]]), 422, loc=["query", 1])
    assert p["detail"] == (
        "query is ragged at index [1]: query[1] has 1 value where query[0] has 2 (the array must be rectangular)"
    )
    p = assert_problem(v1(client, query=[[1.0, 0.0], [[2.0], 3.0]]), 422, loc=["query", 1, 0])
    assert "query[1, 0] is a list where a number is expected" in p["detail"] and "inhomogeneous" not in p["detail"]
    query = {"name": "query", "shape": [2, 2], "datatype": "FP64", "data": [[1.0, 0.0], [3.0]]}
    v2_error(v2(client, query=query), "input 'query'", "not a rectangular", "data is ragged at index [1]")


def test_booleans_and_nulls_in_numbers_are_named(client: TestClient) -> None:
    assert_problem(v1(client, query=[[1.0, True]]), 422, loc=["query", 0, 1], detail="got the boolean true")
    flat = {"shape": [1, 2], "dtype": "float32", "data": [1.0, None]}
    assert_problem(v1(client, query=flat), 422, loc=["query", "data", 1], detail="query.data[1] must be a number")


def test_nan_in_float64_base64_is_not_an_overflow(client: TestClient) -> None:
    import base64

    raw = base64.b64encode(np.array([[1.0, np.nan]]).tobytes()).decode()
    p = assert_problem(v1(client, query={"shape": [1, 2], "dtype": "float64", "b64": raw}), 422, loc=["query", 0, 1])
    assert p["detail"] == "query[0, 1] is nan; values must be finite"


def test_overflow_messages_give_advice_only_where_it_helps(client: TestClient) -> None:
    # float16 data that float16 cannot hold: the declared dtype is at fault, not the precision
    f16 = {"shape": [1, 2], "dtype": "float16", "data": [1e5, 0.0]}
    p = assert_problem(v1(client, query=f16, precision="float64"), 422, loc=["query", 0, 0])
    assert "overflows float16, the declared dtype" in p["detail"] and "precision" not in p["detail"]
    f32 = {"shape": [1, 2], "dtype": "float32", "data": [1e39, 0.0]}
    p = assert_problem(v1(client, query=f32, precision="float64"), 422, loc=["query", 0, 0])
    assert "declare dtype float64" in p["detail"] and "use precision float64" not in p["detail"]
    # float64 data in a float32 computation: there the hint is right
    p = assert_problem(v1(client, query=[[1e39, 0.0]]), 422, loc=["query", 0, 0])
    assert "overflows float32" in p["detail"] and "use precision float64" in p["detail"]


# ------------------------------------------------------------------ valid input: both parsers, the same answer


def test_json_forms_give_the_answer_of_base64(client: TestClient, parser: str) -> None:
    """Nested lists, flat data and /v2 data (flat and nested) decode to the very numbers base64 carries."""
    import base64

    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal(s) for s in ((2, 3, 5, 4), (2, 3, 6, 4), (2, 3, 6, 3)))
    mask = rng.standard_normal((5, 6)) * 3

    def b64(a: np.ndarray) -> dict[str, Any]:
        return {"shape": list(a.shape), "dtype": "float64", "b64": base64.b64encode(a.tobytes()).decode()}

    def flat(a: np.ndarray) -> dict[str, Any]:
        return {"shape": list(a.shape), "dtype": "float64", "data": a.reshape(-1).tolist()}

    common = {"precision": "float64", "return": ["output", "weights"]}
    want = client.post(
        "/v1/attention", json={"query": b64(q), "key": b64(k), "value": b64(v), "mask": b64(mask), **common}
    )
    assert want.status_code == 200, want.text
    nested = v1(client, query=q.tolist(), key=k.tolist(), value=v.tolist(), mask=mask.tolist(), **common)
    flat_form = v1(client, query=flat(q), key=flat(k), value=flat(v), mask=flat(mask), **common)
    for got in (nested, flat_form):
        assert got.status_code == 200, got.text
        assert got.json()["output"] == want.json()["output"] and got.json()["weights"] == want.json()["weights"]
    for nest in (False, True):
        inputs = [
            {
                "name": n,
                "shape": list(a.shape),
                "datatype": "FP64",
                "data": a.tolist() if nest else a.reshape(-1).tolist(),
            }
            for n, a in (("query", q), ("key", k), ("value", v), ("mask", mask))
        ]
        r = client.post(V2, json={"inputs": inputs, "outputs": [{"name": "output"}, {"name": "weights"}]})
        assert r.status_code == 200, r.text
        out = {o["name"]: o["data"] for o in r.json()["outputs"]}
        assert out["output"] == np.array(want.json()["output"]).reshape(-1).tolist()
        assert out["weights"] == np.array(want.json()["weights"]).reshape(-1).tolist()


@pytest.mark.parametrize(
    "fields, fields32, cause",
    [
        ({"scale": 1e300, "temperature": 1e-300}, {"scale": 1e30, "temperature": 1e-30}, "scale / temperature = "),
        (
            {"mask": [-1e300, 0.0], "temperature": 1e-10},
            {"mask": [-1e30, 0.0], "temperature": 1e-10},
            "the float mask divided by the temperature overflows ",
        ),
    ],
)
def test_float64_overflow_does_not_advise_float64(
    client: TestClient, fields: dict[str, Any], fields32: dict[str, Any], cause: str
) -> None:
    p = assert_problem(v1(client, precision="float64", **fields), 422, detail=cause)
    assert "float64" in p["detail"] and "precision float64" not in p["detail"] and "larger temperature" in p["detail"]
    p = assert_problem(v1(client, **fields32), 422, detail=cause)
    assert "float32" in p["detail"] and "use precision float64 or a larger temperature" in p["detail"]
