"""POST /v1/sample: golden cases and reference numbers over HTTP, the response, seeds, and every bad option."""

from __future__ import annotations

import math

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.core import normalizers
from service.settings import Settings
from tests import golden
from tests.http.conftest import assert_problem
from tests.http.test_attention_http import b64, decode

ROW2 = [2.1, 0.5, -1.2, 3.0]
ALL = ["tokens", "logprobs", "raw_logprobs", "top_logprobs", "probabilities", "diagnostics"]
CASES = golden.load("sample")


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_golden(client, case) -> None:
    body = {**case["request"], "precision": "float64", "return": ["probabilities", "tokens"], "n": 4, "seed": 1}
    r = client.post("/v1/sample", json=body)
    assert r.status_code == 200, r.text
    p = np.array(r.json()["probabilities"])
    want = np.array(case["probabilities"])
    np.testing.assert_allclose(p, want, rtol=0, atol=1e-12)
    tokens = np.array(r.json()["tokens"]).reshape(want.reshape(-1, want.shape[-1]).shape[0], 4)
    rows = want.reshape(tokens.shape[0], -1)
    assert np.all(np.take_along_axis(rows, tokens, axis=1) > 0)  # only kept tokens are drawn


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"top_k": 2}, [0.2891, 0, 0, 0.7109]),
        ({"top_p": 0.6}, [0, 0, 0, 1]),
        ({"temperature": 2, "top_p": 0.9}, [0.3314, 0.1489, 0, 0.5197]),
        (
            {
                "repetition_penalty": 1.5,
                "frequency_penalty": 0.1,
                "presence_penalty": 0.2,
                "previous_tokens": [0, 2, 2],
            },
            [0.1209, 0.0663, 0.0045, 0.8083],
        ),
    ],
)
def test_reference_numbers(client, extra, expected) -> None:
    r = client.post("/v1/sample", json={"logits": ROW2, **extra, "return": ["probabilities"]})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json()["probabilities"], expected, atol=1e-4)


def test_every_output_of_a_batch(client) -> None:
    logits = np.random.default_rng(0).standard_normal((3, 40))
    body = {
        "logits": logits.tolist(),
        "top_k": 10,
        "top_p": 0.9,
        "n": 5,
        "seed": 7,
        "top_logprobs": 4,
        "return": ALL,
        "precision": "float64",
    }
    out = client.post("/v1/sample", json=body).json()
    tokens = np.array(out["tokens"])
    p = np.array(out["probabilities"])
    assert tokens.shape == (3, 5) and p.shape == (3, 40) and out["seed"] == 7
    np.testing.assert_allclose(out["logprobs"], np.log(np.take_along_axis(p, tokens, 1)), rtol=1e-12)
    raw = normalizers.log_softmax(logits)
    np.testing.assert_allclose(out["raw_logprobs"], np.take_along_axis(raw, tokens, 1), rtol=1e-12)
    for i, row in enumerate(out["top_logprobs"]):
        assert len(row) == 4
        ids = [e["token"] for e in row]
        assert ids == sorted(range(40), key=lambda j: (-p[i, j], j))[:4]
        np.testing.assert_allclose([e["logprob"] for e in row], np.log(p[i, ids]), rtol=1e-12)
    d = out["diagnostics"]
    assert d["kept"] == np.count_nonzero(p, axis=1).tolist()
    np.testing.assert_allclose(d["entropy_raw"], -(np.exp(raw) * raw).sum(1), rtol=1e-12)
    np.testing.assert_allclose(d["entropy"], [-(r[r > 0] * np.log(r[r > 0])).sum() for r in p], rtol=1e-12)
    soft = np.exp(raw)
    np.testing.assert_allclose(d["removed_mass"], (soft * (p == 0)).sum(1), rtol=1e-9)


def test_a_single_row_answers_without_the_row_axis(client) -> None:
    out = client.post("/v1/sample", json={"logits": ROW2, "n": 3, "top_logprobs": 2, "return": ALL}).json()
    assert len(out["tokens"]) == 3 and len(out["logprobs"]) == 3
    assert [e["token"] for e in out["top_logprobs"]] == [3, 0]
    assert isinstance(out["diagnostics"]["kept"], int) and out["diagnostics"]["kept"] == 4
    assert out["diagnostics"]["entropy_raw"] == pytest.approx(0.8296, abs=1e-4)
    assert len(out["probabilities"]) == 4


def test_the_default_answer(client) -> None:
    out = client.post("/v1/sample", json={"logits": ROW2}).json()
    assert set(out) == {"tokens", "logprobs", "diagnostics", "seed", "timing_ms"}
    assert 0 <= out["seed"] < 2**53 and len(out["tokens"]) == 1


def test_seeds_make_draws_reproducible(client) -> None:
    body = {"logits": np.random.default_rng(2).standard_normal((2, 500)).tolist(), "n": 20, "top_p": 0.95}
    first = client.post("/v1/sample", json={**body, "seed": 99}).json()
    again = client.post("/v1/sample", json={**body, "seed": 99}).json()
    other = client.post("/v1/sample", json={**body, "seed": 100}).json()
    assert first["tokens"] == again["tokens"] and first["tokens"] != other["tokens"]
    drawn = client.post("/v1/sample", json=body).json()  # no seed: the server draws one and says which
    replay = client.post("/v1/sample", json={**body, "seed": drawn["seed"]}).json()
    assert replay["tokens"] == drawn["tokens"]


def test_greedy_ties_go_to_the_lowest_id(client) -> None:
    out = client.post("/v1/sample", json={"logits": [[1, 3, 3, 2], [0, 0, 0, 0]], "temperature": 0, "n": 4}).json()
    assert out["tokens"] == [[1, 1, 1, 1], [0, 0, 0, 0]]
    assert out["logprobs"] == [[0.0] * 4] * 2
    assert out["diagnostics"]["kept"] == [1, 1]


def test_base64_in_and_out(client) -> None:
    logits = np.random.default_rng(4).standard_normal((2, 30000))  # past max_dim: a vocabulary axis may be larger
    body = {"logits": b64(logits, "float32"), "top_k": 50, "n": 2, "seed": 3, "encoding": "base64", "return": ALL}
    out = client.post("/v1/sample", json=body).json()
    tokens, p = decode(out["tokens"]), decode(out["probabilities"])
    assert tokens.dtype == np.int64 and tokens.shape == (2, 2)
    assert p.dtype == np.float32 and p.shape == (2, 30000)
    assert decode(out["logprobs"]).dtype == np.float32 and decode(out["raw_logprobs"]).shape == (2, 2)
    assert np.count_nonzero(p, axis=1).tolist() == [50, 50] == out["diagnostics"]["kept"]
    flat = client.post("/v1/sample", json={**body, "encoding": "json"}).json()
    assert flat["tokens"] == tokens.tolist()


def test_masks_and_penalties_per_row(client) -> None:
    body = {
        "logits": [ROW2, ROW2],
        "mask": [[True, True, True, False], [True, True, True, True]],
        "previous_tokens": [[], [3, 3]],
        "frequency_penalty": 1.0,
        "return": ["probabilities"],
        "precision": "float64",
    }
    p = np.array(client.post("/v1/sample", json=body).json()["probabilities"])
    np.testing.assert_allclose(p[0], [*normalizers.softmax(np.array(ROW2[:3])), 0], rtol=1e-12)
    np.testing.assert_allclose(p[1], normalizers.softmax(np.array([2.1, 0.5, -1.2, 1.0])), rtol=1e-12)


@pytest.mark.parametrize(
    ("extra", "loc"),
    [
        ({"temperature": -0.5}, ["temperature"]),
        ({"temperature": "hot"}, ["temperature"]),
        ({"top_k": -1}, ["top_k"]),
        ({"top_k": 2.5}, ["top_k"]),
        ({"top_p": 0}, ["top_p"]),
        ({"top_p": 1.01}, ["top_p"]),
        ({"min_p": 1}, ["min_p"]),
        ({"min_p": -0.1}, ["min_p"]),
        ({"repetition_penalty": 0}, ["repetition_penalty"]),
        ({"presence_penalty": "x"}, ["presence_penalty"]),
        ({"frequency_penalty": None}, ["frequency_penalty"]),
        ({"n": 0}, ["n"]),
        ({"n": 100000}, ["n"]),
        ({"seed": -1}, ["seed"]),
        ({"seed": 1.5}, ["seed"]),
        ({"top_logprobs": 21}, ["top_logprobs"]),
        ({"return": ["tokens", "weights"]}, ["return", 1]),
        ({"encoding": "hex"}, ["encoding"]),
        ({"precision": "float16"}, ["precision"]),
        ({"previous_tokens": [0, 4]}, ["previous_tokens", 1]),
        ({"previous_tokens": [0, -1]}, ["previous_tokens", 1]),
        ({"previous_tokens": [0, 1.5]}, ["previous_tokens", 1]),
        ({"previous_tokens": [0, True]}, ["previous_tokens", 1]),
        ({"previous_tokens": ["a"]}, ["previous_tokens", 0]),
        ({"previous_tokens": [2**70]}, ["previous_tokens", 0]),
        ({"previous_tokens": [[1], 2]}, ["previous_tokens", 1]),
        ({"previous_tokens": [[1, "x"]]}, ["previous_tokens", 0, 1]),
        ({"previous_tokens": 3}, ["previous_tokens"]),
        ({"mask": [True, False]}, ["mask", "shape"]),
        ({"mask": [False, False, False, False]}, ["mask"]),
        ({"temprature": 1}, ["temprature"]),
        ({"logits": [[[1.0, 2.0]]]}, ["logits"]),
        ({"logits": []}, ["logits", "shape", 0]),
        ({"logits": [1.0, "a"]}, ["logits"]),
        ({"logits": {"shape": [2], "dtype": "float64", "b64": b64([1.0, math.nan])["b64"]}}, ["logits", 1]),
    ],
    ids=lambda v: str(v)[:40],
)
def test_bad_options_are_422_naming_the_field(client, extra, loc) -> None:
    r = client.post("/v1/sample", json={"logits": ROW2, **extra})
    body = assert_problem(r, 422)
    assert any(e["loc"][: len(loc)] == loc for e in body["errors"]), body["errors"]


def test_per_row_previous_tokens_must_match_the_rows(client) -> None:
    r = client.post("/v1/sample", json={"logits": [ROW2, ROW2], "previous_tokens": [[1], [2], [3]]})
    assert_problem(r, 422, loc=["previous_tokens"])
    r = client.post("/v1/sample", json={"logits": [ROW2, ROW2], "previous_tokens": [[1], [0, 9]]})
    assert_problem(r, 422, loc=["previous_tokens", 1, 1])


def test_over_budget_is_413_before_the_work() -> None:
    app = create_app(Settings(enable_onnx=False, max_work_flops=1e6))
    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.post("/v1/sample", json={"logits": b64(np.zeros((4, 20000)), "float32")})
        assert_problem(r, 413, detail="estimated work")
    small = create_app(Settings(enable_onnx=False, max_response_bytes=10000))
    with TestClient(small, raise_server_exceptions=False) as c:
        r = c.post("/v1/sample", json={"logits": np.zeros((2, 2000)).tolist(), "return": ["probabilities"]})
        assert_problem(r, 413, detail="response size")


def test_vocabulary_over_max_vocab_is_422() -> None:
    app = create_app(Settings(enable_onnx=False, max_vocab=100, max_dim=50))
    with TestClient(app, raise_server_exceptions=False) as c:
        assert c.post("/v1/sample", json={"logits": [0.0] * 100}).status_code == 200
        assert_problem(c.post("/v1/sample", json={"logits": [0.0] * 101}), 422, loc=["logits", "shape", 0])
        assert_problem(c.post("/v1/sample", json={"logits": [[0.0]] * 51}), 422, loc=["logits", "shape", 0])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_extreme_logits_never_answer_nan(client, dtype: str) -> None:
    big = 3e38 if dtype == "float32" else 1.7e308
    for extra in (
        {},
        {"temperature": 0.5, "top_p": 0.5},
        {"temperature": 1e-300, "min_p": 0.5},
        {"temperature": 1e308},
    ):
        # A seed that draws token 0 or 2 (a draw of token 1 has a raw log-probability beyond float32: a 422).
        body = {"logits": b64([big, -big, 0.0], dtype), "precision": dtype, "return": ALL, "top_logprobs": 3, **extra}
        body["seed"] = 3
        r = client.post("/v1/sample", json=body)
        assert r.status_code == 200, r.text
        assert "null" not in r.text and "NaN" not in r.text
        out = r.json()
        if extra.get("temperature") == 1e308:  # T beyond float32: clamped to its largest finite number
            assert sum(out["probabilities"]) == pytest.approx(1, rel=1e-6)
        else:
            assert out["tokens"] == [0] and out["probabilities"] == [1.0, 0.0, 0.0]


def test_a_raw_logprob_beyond_float32_is_refused_not_null(client) -> None:
    """The only token the mask keeps is 6e38 below the largest logit: its raw log-probability, -6e38 in float64,
    is beyond float32. Refused by element with the remedy; answered exactly in float64.
    """
    body = {"logits": b64([3e38, -3e38, 0.0], "float32"), "mask": [False, True, False], "seed": 1}
    r = client.post("/v1/sample", json={**body, "return": ["tokens", "raw_logprobs"]})
    problem = assert_problem(r, 422)
    assert problem["detail"].startswith("raw_logprobs[0] = -6e+38 is beyond float32") and "float64" in problem["detail"]
    assert client.post("/v1/sample", json={**body, "return": ["tokens", "logprobs"]}).json()["tokens"] == [1]
    exact = client.post("/v1/sample", json={**body, "precision": "float64", "return": ["tokens", "raw_logprobs"]})
    big = float(np.float32(3e38))  # the logits as sent, float32
    assert exact.json()["raw_logprobs"] == [pytest.approx(-2 * big, rel=1e-12)]


@pytest.mark.parametrize("penalty", [1e308, -1e308])
def test_huge_penalties_are_a_clear_answer(client, penalty: float) -> None:
    body = {"logits": ROW2, "previous_tokens": [1, 1], "frequency_penalty": penalty, "presence_penalty": penalty}
    r = client.post("/v1/sample", json={**body, "return": ["probabilities"], "precision": "float64"})
    if penalty > 0:  # token 1 pushed to -inf: removed
        assert r.status_code == 200 and r.json()["probabilities"][1] == 0
    else:  # pushed to +inf: refused, naming the penalty
        assert_problem(r, 422, loc=["frequency_penalty"])
