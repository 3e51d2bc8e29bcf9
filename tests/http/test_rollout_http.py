"""Attention rollout over REST: ``POST /v1/attention/rollout`` and the /v2 model ``attention_rollout`` give the golden
cases' numbers in every wire form and the same numbers as each other; refusals name the field (422 on /v1, 400 on
/v2); the budget refuses a whole ``[B, L, L]`` answer that is too large naming ``rows``, and serves the rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.dataplane.rollout import RolloutOptions, StackDims, estimate
from service.settings import Settings
from tests import golden
from tests.http.conftest import assert_problem
from tests.http.test_attention_http import b64, decode
from tests.http.test_v2 import assert_error, binary_request, json_input, wait_ready
from tests.http.test_v2_logits import outputs_of

CASES = golden.load("rollout")
V1 = "/v1/attention/rollout"
V2 = "/v2/models/attention_rollout/infer"
RNG = np.random.default_rng(5)


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(create_app(Settings(enable_onnx=False)), raise_server_exceptions=False) as c:
        wait_ready(c)
        yield c


def stack(layers: int, batch: int, heads: int, length: int) -> np.ndarray:
    logits = RNG.standard_normal((layers, batch, heads, length, length)) * 2
    w = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return w / w.sum(axis=-1, keepdims=True)


def options(case: dict[str, Any]) -> dict[str, Any]:
    return {"head_fusion": case["head_fusion"], "discard_ratio": case["discard_ratio"]}


def v1_body(case: dict[str, Any], form: str, precision: str) -> dict[str, Any]:
    dtype = case["dtype"]
    body: dict[str, Any] = {**options(case), "precision": precision}
    for name in ("weights", "gradients"):
        if case[name] is not None:
            body[name] = b64(case[name], dtype) if form == "b64" else case[name]
    return body


@pytest.mark.parametrize("i", range(len(CASES)))
@pytest.mark.parametrize("precision", ["float64", "float32"])
def test_golden_over_v1(client: TestClient, i: int, precision: str) -> None:
    case = CASES[i]
    tol = 1e-12 if precision == "float64" else 1e-6
    # JSON lists carry float64 values; a float32 case's values are float32's, held to float32's row tolerance
    forms = ["b64"] if case["dtype"] == "float32" and precision == "float64" else ["lists", "b64"]
    for form in forms:
        r = client.post(V1, json={**v1_body(case, form, precision), "encoding": "base64"})
        assert r.status_code == 200, r.text
        got = decode(r.json()["rollout"])
        assert got.dtype == np.dtype(precision) and set(r.json()["timing_ms"]) >= {"decode", "compute", "total"}
        np.testing.assert_allclose(got, np.array(case["expected"]), rtol=tol, atol=tol)


@pytest.mark.parametrize("i", range(len(CASES)))
def test_golden_over_v2_json_and_binary(client: TestClient, i: int) -> None:
    case = CASES[i]
    datatype = "FP32" if case["dtype"] == "float32" else "FP64"
    arrays = [(n, np.array(case[n], dtype=case["dtype"])) for n in ("weights", "gradients") if case[n] is not None]
    tol = 1e-6 if datatype == "FP32" else 1e-12
    parameters = options(case)
    r = client.post(V2, json={"inputs": [json_input(n, a, datatype) for n, a in arrays], "parameters": parameters})
    _, got = outputs_of(r)
    np.testing.assert_allclose(got["rollout"], np.array(case["expected"]), rtol=tol, atol=tol)
    body, headers = binary_request(
        [(n, a, datatype) for n, a in arrays], parameters={**parameters, "binary_data_output": True}
    )
    header, binary = outputs_of(client.post(V2, content=body, headers=headers))
    assert header["outputs"][0]["datatype"] == datatype and header["model_name"] == "attention_rollout"
    np.testing.assert_array_equal(binary["rollout"], got["rollout"])


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"head_fusion": "max", "residual": 0.3},
        {"discard_ratio": 0.6, "rows": [0, -1]},
        {"gradients": True, "rows": [2]},
        {"renormalize": True, "residual": 0.0},
    ],
    ids=repr,
)
def test_v1_and_v2_give_the_same_numbers(client: TestClient, extra: dict[str, Any]) -> None:
    w = stack(3, 2, 4, 6)
    if extra.get("renormalize"):
        w *= RNG.uniform(0.5, 2.0, size=w.shape[:-1] + (1,))
    g = RNG.standard_normal(w.shape)
    opts = {k: v for k, v in extra.items() if k not in ("gradients", "rows")}
    body: dict[str, Any] = {"weights": w.tolist(), "precision": "float64", **opts}
    inputs = [json_input("weights", w, "FP64")]
    if extra.get("gradients"):
        body["gradients"] = g.tolist()
        inputs.append(json_input("gradients", g, "FP64"))
    if "rows" in extra:
        body["rows"] = extra["rows"]
        inputs.append(json_input("rows", np.array(extra["rows"]), "INT64"))
    r = client.post(V1, json=body)
    assert r.status_code == 200, r.text
    _, v2 = outputs_of(client.post(V2, json={"inputs": inputs, "parameters": opts}))
    np.testing.assert_array_equal(np.array(r.json()["rollout"]), v2["rollout"])
    assert v2["rollout"].shape == (2, len(extra.get("rows", range(6))), 6)


def test_float16_weights_answer_float32(client: TestClient) -> None:
    w = stack(2, 1, 3, 5).astype(np.float16)  # rows sum to 1 within float16's rounding, about 5e-4
    r = client.post(V1, json={"weights": b64(w, "float16"), "encoding": "base64"})
    assert r.status_code == 200, r.text
    got = decode(r.json()["rollout"])
    assert got.dtype == np.float32
    body, headers = binary_request([("weights", w, "FP16")], parameters={"binary_data_output": True})
    header, v2 = outputs_of(client.post(V2, content=body, headers=headers))
    assert header["outputs"][0]["datatype"] == "FP32"
    np.testing.assert_array_equal(v2["rollout"], got)
    r = client.post(V1, json={"weights": b64(w, "float32")})  # the same values sent as float32: 1e-5 applies
    assert_problem(r, 422, detail="neither 1 (within 1e-05) nor 0")


def test_integers_in_json_lists_are_numbers(client: TestClient) -> None:
    r = client.post(V1, json={"weights": [[[[[1, 0], [0, 1]]]]], "precision": "float64"})
    assert r.status_code == 200, r.text
    assert r.json()["rollout"] == [[[1.0, 0.0], [0.0, 1.0]]]


def test_metadata(client: TestClient) -> None:
    meta = client.get("/v2/models/attention_rollout").json()
    assert [(t["name"], t["ranks"]) for t in meta["inputs"]] == [("weights", [5]), ("gradients", [5]), ("rows", [1])]
    assert meta["inputs"][2]["datatypes"] == ["INT64", "INT32"] and meta["outputs"][0]["ranks"] == [3]
    assert set(meta["parameters"]) == {
        "head_fusion",
        "residual",
        "discard_ratio",
        "renormalize",
        "top_k",
        "binary_data_output",
    }
    assert [(t["name"], t["datatype"]) for t in meta["outputs"]] == [
        ("rollout", "FP32"),
        ("top_keys", "INT64"),
        ("top_values", "FP32"),
    ]


# ------------------------------------------------------------------------------------------------ top keys


def largest(rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's k largest entries and their indices, largest first, equal entries by index (Python's sort)."""
    flat = rows.reshape(-1, rows.shape[-1]).tolist()
    keys = np.array([[j for _, j in sorted((-v, j) for j, v in enumerate(row))[:k]] for row in flat])
    keys = keys.reshape((*rows.shape[:-1], k))
    return keys, np.take_along_axis(rows, keys, axis=-1)


def test_top_k_answers_each_rows_largest_entries_on_v1_and_v2(client: TestClient) -> None:
    w = stack(3, 2, 4, 6)
    whole = np.array(client.post(V1, json={"weights": w.tolist(), "precision": "float64"}).json()["rollout"])
    want_keys, want_values = largest(whole[:, [0, -1]], 3)
    r = client.post(V1, json={"weights": w.tolist(), "precision": "float64", "rows": [0, -1], "top_k": 3})
    assert r.status_code == 200, r.text
    assert set(r.json()) == {"top_keys", "top_values", "timing_ms"}  # the whole rows are not sent
    np.testing.assert_array_equal(np.array(r.json()["top_keys"]), want_keys)
    np.testing.assert_array_equal(np.array(r.json()["top_values"]), want_values)
    b64_form = client.post(V1, json={"weights": w.tolist(), "top_k": 3, "encoding": "base64"}).json()
    keys = decode(b64_form["top_keys"])
    assert keys.dtype == np.int64 and keys.shape == (2, 6, 3) and decode(b64_form["top_values"]).dtype == np.float32
    np.testing.assert_array_equal(keys, largest(whole, 3)[0])

    inputs = [json_input("weights", w, "FP64"), json_input("rows", np.array([0, -1]), "INT64")]
    header, v2 = outputs_of(client.post(V2, json={"inputs": inputs, "parameters": {"top_k": 3}}))
    assert [(o["name"], o["datatype"]) for o in header["outputs"]] == [("top_keys", "INT64"), ("top_values", "FP64")]
    np.testing.assert_array_equal(v2["top_keys"], want_keys)
    np.testing.assert_array_equal(v2["top_values"], want_values)
    body, headers = binary_request(
        [("weights", w, "FP64")],
        outputs=[{"name": "rollout"}, {"name": "top_keys"}],
        parameters={"top_k": 2, "binary_data_output": True},
    )
    _, both = outputs_of(client.post(V2, content=body, headers=headers))
    np.testing.assert_array_equal(both["rollout"], whole)
    np.testing.assert_array_equal(both["top_keys"], largest(whole, 2)[0])


@pytest.mark.parametrize(
    ("outputs", "parameters", "fragment"),
    [
        ([{"name": "top_keys"}], {}, "the top keys of the rollout are asked for without top_k: send top_k"),
        ([{"name": "rollout"}], {"top_k": 2}, "top_k asks for the outputs top_keys and top_values"),
        (None, {"top_k": 7}, "top_k 7 is outside [1, 6]"),
        (None, {"top_k": 0}, "parameter 'top_k'"),
    ],
)
def test_v2_top_k_refusals_name_it(
    client: TestClient, outputs: list[dict[str, Any]] | None, parameters: dict[str, Any], fragment: str
) -> None:
    body: dict[str, Any] = {"inputs": [json_input("weights", stack(1, 1, 1, 6), "FP64")], "parameters": parameters}
    if outputs is not None:
        body["outputs"] = outputs
    assert_error(client.post(V2, json=body), 400, fragment)


# ------------------------------------------------------------------------------------------------ refusals


W = stack(2, 1, 2, 3)
NEGATIVE = W.copy()
NEGATIVE[0, 0, 1, 2, 1] = -0.5


@pytest.mark.parametrize(
    ("body", "loc", "detail"),
    [
        ({"weights": W[0].tolist()}, ["weights", "shape"], "weights has rank 4; it must have rank 5"),
        ({"weights": W[..., :2].tolist()}, ["weights", "shape", 4], "its last two axes must be equal"),
        ({"weights": W.tolist(), "gradients": W[:1].tolist()}, ["gradients", "shape"], "gradients has shape"),
        ({"weights": NEGATIVE.tolist()}, ["weights", 0, 0, 1, 2, 1], "(layer 0, batch 0, head 1, row 2) = -0.5 is"),
        ({"weights": (W * 1.1).tolist()}, ["weights", 0, 0, 0, 0], "sums to 1.1, neither 1"),
        ({"weights": W.tolist(), "rows": [0, 3]}, ["rows", 1], "rows[1] = 3 is out of range"),
        ({"weights": W.tolist(), "rows": [0, -3]}, ["rows", 1], "rows[1] = -3 is row 0 again"),
        ({"weights": W.tolist(), "rows": []}, ["rows"], None),
        ({"weights": W.tolist(), "rows": [0.5]}, ["rows", 0], None),
        ({"weights": W.tolist(), "head_fusion": "median"}, ["head_fusion"], None),
        ({"weights": W.tolist(), "residual": 1.5}, ["residual"], None),
        ({"weights": W.tolist(), "discard_ratio": -0.1}, ["discard_ratio"], None),
        ({"weights": W.tolist(), "gradients": W.tolist(), "head_fusion": "min"}, ["head_fusion"], "no gradient"),
        ({"weights": W.tolist(), "return": ["rollout"]}, ["return"], None),
        ({"weights": W.tolist(), "top_k": 4}, ["top_k"], "top_k 4 is outside [1, 3]"),
        ({"weights": W.tolist(), "top_k": 0}, ["top_k"], None),
        ({"weights": W.tolist(), "top_k": 1.5}, ["top_k"], None),
    ],
)
def test_v1_refusals_name_the_field(client: TestClient, body: dict[str, Any], loc: list[Any], detail: str) -> None:
    assert_problem(client.post(V1, json=body), 422, loc=loc, detail=detail)


def test_non_finite_weights_are_named(client: TestClient) -> None:
    bad = W.copy()
    bad[1, 0, 1, 2, 0] = np.nan
    r = client.post(V1, json={"weights": b64(bad)})
    assert_problem(r, 422, loc=["weights", 1, 0, 1, 2, 0], detail="weights[1, 0, 1, 2, 0] (layer 1, batch 0, head 1")


@pytest.mark.parametrize(
    ("inputs", "parameters", "fragments"),
    [
        ([("weights", W[0], "FP64")], {}, ("weights has rank 4; ranks 5 to 5 are accepted",)),
        ([("weights", W, "FP64")], {"residual": 2}, ("parameter 'residual'",)),
        ([("weights", W, "FP64")], {"temperature": 2}, ("has no parameter 'temperature'",)),
        ([("weights", W, "FP64"), ("rows", np.array([4]), "INT64")], {}, ("rows[0] = 4 is out of range",)),
        ([("weights", W, "FP64"), ("rows", np.array([1.0]), "FP64")], {}, ("input 'rows' has datatype 'FP64'",)),
        ([("weights", W, "FP64"), ("gradients", W, "FP32")], {}, ("must share one precision",)),
        ([("weights", W * 2, "FP64")], {}, ("weights[0, 0, 0, 0] (layer 0, batch 0, head 0, row 0) sums to 2",)),
    ],
)
def test_v2_refusals_are_400_naming_the_input_or_parameter(
    client: TestClient, inputs: list[tuple[str, np.ndarray, str]], parameters: dict[str, Any], fragments: tuple[str]
) -> None:
    body = {"inputs": [json_input(n, a, d) for n, a, d in inputs], "parameters": parameters}
    assert_error(client.post(V2, json=body), 400, *fragments)


def test_renormalize_accepts_rows_that_do_not_sum_to_one(client: TestClient) -> None:
    r = client.post(V1, json={"weights": (W * 3).tolist(), "renormalize": True, "precision": "float64"})
    want = client.post(V1, json={"weights": W.tolist(), "precision": "float64"}).json()["rollout"]
    np.testing.assert_allclose(r.json()["rollout"], want, rtol=1e-14, atol=1e-15)


# ------------------------------------------------------------------------------------------------ limits


def test_each_layer_is_held_to_the_tensor_limit() -> None:
    settings = Settings(enable_onnx=False, max_tensor_elements=2 * 4 * 4)  # one layer [1, 2, 4, 4]
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        fits = stack(3, 1, 2, 4)  # 96 elements in all, 32 per layer
        assert c.post(V1, json={"weights": fits.tolist()}).status_code == 200
        too_many = stack(1, 1, 3, 4)
        detail = "weights has 48 elements per layer ([B, H, L, L] = [1, 3, 4, 4]), above the limit of 32"
        assert_problem(c.post(V1, json={"weights": too_many.tolist()}), 422, loc=["weights", "shape"], detail=detail)
        body = {"inputs": [json_input("weights", too_many, "FP64")]}
        assert_error(c.post(V2, json=body), 400, detail)


def test_a_whole_answer_over_the_work_budget_is_refused_naming_rows() -> None:
    w = stack(4, 1, 1, 128)
    dims, opts = StackDims(4, 1, 1, 128), RolloutOptions()
    whole, _, _ = estimate(dims, None, opts, False, "float32", "json")
    one_row, _, _ = estimate(dims, 1, opts, False, "float32", "json")
    assert whole - one_row == pytest.approx(2 * 2 * 3 * 127 * 128 * 128)  # float64 products: twice their flops
    limit = (whole + one_row) / 2
    with TestClient(create_app(Settings(enable_onnx=False, max_work_flops=limit))) as c:
        r = c.post(V1, json={"weights": w.tolist()})
        body = assert_problem(r, 413, detail=f"exceeds the limit of {limit:.3g}; the whole [B, L, L] rollout is what")
        assert "send rows (e.g. [0]" in body["detail"]
        assert_error(c.post(V2, json={"inputs": [json_input("weights", w, "FP64")]}), 413, "send rows (e.g. [0]")
        r = c.post(V1, json={"weights": w.tolist(), "rows": [0]})
        assert r.status_code == 200, r.text
        assert np.array(r.json()["rollout"]).shape == (1, 1, 128)


def test_a_whole_answer_over_the_response_limit_is_refused_naming_rows() -> None:
    w = stack(2, 1, 1, 32)  # 1,024 numbers: about 16 KiB of JSON
    with TestClient(create_app(Settings(enable_onnx=False, max_response_bytes=8192))) as c:
        r = c.post(V1, json={"weights": w.tolist()})
        body = assert_problem(r, 413, detail="estimated response size 20480 bytes exceeds the limit of 8192; the whole")
        assert "send top_k to have only each row's k largest entries" in body["detail"]
        assert c.post(V1, json={"weights": w.tolist(), "rows": [-1]}).status_code == 200
        top = c.post(V1, json={"weights": w.tolist(), "top_k": 2})  # 32 rows x 2 values and indices
        assert top.status_code == 200, top.text
        assert np.array(top.json()["top_keys"]).shape == (1, 32, 2)
        many = {"weights": w.tolist(), "rows": list(range(32))}
        assert_problem(c.post(V1, json=many), 413, detail="8192; send top_k to have only each row's k largest")
        wide = {"weights": w.tolist(), "top_k": 32}
        assert_problem(c.post(V1, json=wide), 413, detail="8192; send a smaller top_k, fewer rows or batch entries")
