"""POST /v1/attention over HTTP: golden cases in every wire form, encodings and errors."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from tests.golden import load, tolerance
from tests.http.conftest import assert_problem


def flat(x, dtype: str = "float64") -> dict:
    a = np.asarray(x)
    return {"shape": list(a.shape), "dtype": dtype, "data": a.reshape(-1).tolist()}


def b64(x, dtype: str = "float64") -> dict:
    a = np.ascontiguousarray(np.asarray(x, dtype=np.dtype(dtype).newbyteorder("<")))
    return {"shape": list(a.shape), "dtype": dtype, "b64": base64.b64encode(a.tobytes()).decode()}


def decode(t) -> np.ndarray:
    if isinstance(t, dict):
        return np.frombuffer(base64.b64decode(t["b64"]), dtype=np.dtype(t["dtype"]).newbyteorder("<")).reshape(
            t["shape"]
        )
    return np.array(t, dtype=float)


def as_form(request: dict, form: str) -> dict:
    body = dict(request)
    for name in ("query", "key", "value", "mask"):
        if name not in body or form == "nested":
            continue
        arr = np.array(body[name])
        dtype = "bool" if arr.dtype == bool else "float64"
        body[name] = flat(arr, dtype) if form == "flat" else b64(arr, dtype)
    return body


@pytest.mark.parametrize("form", ["nested", "flat", "b64"])
@pytest.mark.parametrize("case", load("attention"), ids=lambda c: c["request"]["normalizer"])
def test_golden_over_http(client, case: dict, form: str) -> None:
    body = as_form(case["request"], form)
    body["encoding"] = "base64" if form == "b64" else "json"
    r = client.post("/v1/attention", json=body)
    assert r.status_code == 200, r.text
    got = r.json()
    tol = tolerance(case["request"])
    np.testing.assert_allclose(decode(got["output"]), np.array(case["expected"]["output"]), atol=tol, rtol=0)
    np.testing.assert_allclose(decode(got["weights"]), np.array(case["expected"]["weights"]), atol=tol, rtol=0)
    assert got["engine"]["name"] == "numpy"
    rows = np.array(case["request"]["query"]).shape[:-1]
    assert np.array(got["diagnostics"]["entropy"]).shape == rows


def small_request(**extra) -> dict:
    rng = np.random.default_rng(0)
    body = {
        "query": rng.standard_normal((2, 3, 4)).tolist(),
        "key": rng.standard_normal((2, 5, 4)).tolist(),
        "value": rng.standard_normal((2, 5, 2)).tolist(),
    }
    body.update(extra)
    return body


def test_defaults_float32_output_weights_diagnostics(client) -> None:
    r = client.post("/v1/attention", json=small_request())
    assert r.status_code == 200
    body = r.json()
    assert set(body) == {"output", "weights", "diagnostics", "engine", "timing_ms"}
    w = np.array(body["weights"])
    assert w.shape == (2, 3, 5)
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-6)
    d = body["diagnostics"]
    for key in (
        "entropy",
        "normalized_entropy",
        "max_weight",
        "attention_distance",
        "fully_masked_rows",
        "row_sum_max_error",
        "heads",
    ):
        assert key in d
    assert len(d["heads"]) == 2 and d["fully_masked_rows"] == 0
    assert body["timing_ms"]["total"] >= body["timing_ms"]["compute"] >= 0


def test_return_subset_and_scores_with_masked_null(client) -> None:
    r = client.post("/v1/attention", json=small_request(causal=True, **{"return": ["scores"]}, precision="float64"))
    body = r.json()
    assert set(body) == {"scores", "engine", "timing_ms"}
    s = body["scores"]
    assert s[0][0][1] is None and s[0][0][0] is not None  # -inf (masked) is written as null
    r = client.post(
        "/v1/attention", json=small_request(causal=True, encoding="base64", **{"return": ["scores", "output"]})
    )
    scores = decode(r.json()["scores"])
    assert np.isneginf(scores[0, 0, 1]) and r.json()["scores"]["dtype"] == "float32"


def test_fully_masked_rows_are_zeros_over_http(client) -> None:
    mask = np.ones((3, 5), dtype=bool)
    mask[1] = False
    r = client.post("/v1/attention", json=small_request(mask=mask.tolist()))
    body = r.json()
    assert np.all(np.array(body["output"])[:, 1] == 0) and np.all(np.array(body["weights"])[:, 1] == 0)
    assert body["diagnostics"]["fully_masked_rows"] == 2


def test_key_lengths_and_gqa(client) -> None:
    rng = np.random.default_rng(3)
    body = {
        "query": rng.standard_normal((2, 4, 3, 8)).tolist(),
        "key": rng.standard_normal((2, 2, 5, 8)).tolist(),
        "value": rng.standard_normal((2, 2, 5, 4)).tolist(),
        "key_lengths": [5, 2],
    }
    w = np.array(client.post("/v1/attention", json=body).json()["weights"])
    assert w.shape == (2, 4, 3, 5) and np.all(w[1, :, :, 2:] == 0)
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-6)


@pytest.mark.parametrize(
    "patch,status,loc,detail",
    [
        ({"key": np.ones((2, 5, 3)).tolist()}, 422, ["key", "shape", 2], "key has E=3 but query has E=4"),
        ({"value": np.ones((2, 4, 2)).tolist()}, 422, ["value", "shape", 1], "value has S=4 but key has S=5"),
        ({"query": [[1.0, 2.0], [3.0]]}, 422, ["query", 1], "query is ragged at index [1]"),
        ({"query": [[1.0, "a"]]}, 422, ["query", 0, 1], "query[0, 1] must be a number, got the string 'a'"),
        ({"query": [[1.0, None]]}, 422, ["query", 0, 1], "query[0, 1] must be a number, got null"),
        ({"query": []}, 422, ["query"], None),
        ({"query": [[]]}, 422, ["query", "shape", 1], None),
        ({"query": 5}, 422, ["query"], None),
        ({"query": [[[[[1.0]]]]]}, 422, ["query"], "rank"),
        ({"query": {"shape": [2, 3, 4], "dtype": "float64", "data": [1.0] * 5}}, 422, ["query", "data"], "needs 24"),
        ({"query": {"shape": [2, 3, 4], "dtype": "float64", "b64": "!!!"}}, 422, ["query", "b64"], "base64"),
        ({"query": {"shape": [2, 3, 4], "dtype": "int8", "data": [1] * 24}}, 422, ["query", "dtype"], None),
        ({"query": {"shape": [100000, 100000, 4], "dtype": "float32", "b64": ""}}, 422, ["query", "shape", 0], "limit"),
        ({"normalizer": "entmax"}, 422, ["alpha"], "alpha"),
        ({"normalizer": "entmax", "alpha": 1.0}, 422, ["alpha"], None),
        ({"normalizer": "gumbel"}, 422, ["normalizer"], None),
        ({"temperature": 0}, 422, ["temperature"], None),
        ({"scale": -1}, 422, ["scale"], None),
        ({"causal": "left"}, 422, None, None),
        ({"key_lengths": [1, 2]}, 422, ["key_lengths"], "batch size B is 1"),
        ({"key_lengths": [9]}, 422, ["key_lengths", 0], "outside"),
        ({"key_lengths": [-1]}, 422, ["key_lengths", 0], None),
        ({"mask": np.ones((4, 5), dtype=bool).tolist()}, 422, ["mask", "shape", 0], "mask has L=4"),
        ({"precision": "float16"}, 422, ["precision"], None),
        ({"return": ["everything"]}, 422, None, None),
        ({"temprature": 2}, 422, ["temprature"], None),
        ({"engine": "tpu"}, 422, ["engine"], None),
    ],
)
def test_invalid_requests_get_problem_details(client, patch, status, loc, detail) -> None:
    body = small_request()
    body.update(patch)
    assert_problem(client.post("/v1/attention", json=body), status, loc=loc, detail=detail)


def test_non_finite_values_are_named_by_index(client) -> None:
    q = np.ones((2, 3, 4))
    q[1, 2, 3] = np.nan
    body = small_request(query=b64(q))
    p = assert_problem(client.post("/v1/attention", json=body), 422, loc=["query", 1, 2, 3])
    assert "query[1, 2, 3]" in p["detail"]
    big = small_request(query=flat(np.full((2, 3, 4), 1e39)))
    assert_problem(client.post("/v1/attention", json=big), 422, loc=["query", 0, 0, 0], detail="overflows float32")


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"{",
        b"[1, 2]",
        b'{"query": NaN}',
        b'{"query": [[Infinity]]}',
        b'{"query": [[1e999]]}',
        b"\xff\xfe",
        b"null",
        b'"x"',
    ],
)
def test_malformed_bodies_are_422_not_500(client, raw: bytes) -> None:
    r = client.post("/v1/attention", content=raw, headers={"content-type": "application/json"})
    assert_problem(r, 422)


def test_tiny_temperature_is_a_clear_error(client) -> None:
    assert_problem(client.post("/v1/attention", json=small_request(temperature=1e-300)), 422, detail="float64")


def test_budget_gives_413_before_allocating(client) -> None:
    body = {
        "query": {
            "shape": [1, 4096, 8],
            "dtype": "float32",
            "b64": base64.b64encode(np.zeros((1, 4096, 8), np.float32).tobytes()).decode(),
        },
        "key": {
            "shape": [1, 4096, 8],
            "dtype": "float32",
            "b64": base64.b64encode(np.zeros((1, 4096, 8), np.float32).tobytes()).decode(),
        },
        "value": {
            "shape": [1, 4096, 8],
            "dtype": "float32",
            "b64": base64.b64encode(np.zeros((1, 4096, 8), np.float32).tobytes()).decode(),
        },
    }
    # 16.7M weights as JSON exceed the default 256 MiB response budget
    assert_problem(client.post("/v1/attention", json=body), 413, detail="response size")
    body["return"] = ["output"]
    assert client.post("/v1/attention", json=body).status_code == 200


def test_unknown_route_and_method_are_problems(client) -> None:
    assert_problem(client.get("/v1/nothing"), 404)
    assert_problem(client.get("/v1/attention"), 405)


def test_health_and_readiness(client) -> None:
    assert client.get("/healthz").json()["status"] == "ok"
    r = client.get("/readyz")
    assert r.status_code == 200 and r.json()["ready"] is True
