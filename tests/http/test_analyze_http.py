"""POST /v1/attention/analyze over HTTP: defaults, drawn and sent inputs, sweeps, errors and the work bound."""

from __future__ import annotations

import math

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.core.analysis import analyze, sweep_points
from service.settings import Settings
from tests.http.conftest import assert_problem
from tests.http.test_attention_http import b64

ROW_KEYS = {
    "scale",
    "temperature",
    "head_dim",
    "score_std",
    "score_range",
    "mean_entropy",
    "mean_normalized_entropy",
    "saturated_fraction",
    "mean_jacobian_norm",
    "vanishing_fraction",
    "rows",
}


def test_defaults_on_drawn_inputs(client) -> None:
    r = client.post("/v1/attention/analyze", json={"shape": [1, 2, 16, 64], "seed": 5})
    assert r.status_code == 200, r.text
    body = r.json()
    sweep = body["sweep"]
    # default scales [1, 1/sqrt(E)] times default temperatures [0.5, 1, 2]
    assert [(row["scale"], row["temperature"]) for row in sweep] == [
        (s, t) for s in (1.0, 1 / math.sqrt(64)) for t in (0.5, 1.0, 2.0)
    ]
    assert all(set(row) == ROW_KEYS and row["head_dim"] == 64 for row in sweep)
    assert body["shape"] == [1, 2, 16, 16] and body["seed"] == 5 and body["normalizer"] == "softmax"
    assert body["vanishing_threshold"] == 1e-3 and body["saturation_margin"] == 1e-6
    again = client.post("/v1/attention/analyze", json={"shape": [1, 2, 16, 64], "seed": 5}).json()["sweep"]
    assert again == sweep  # same seed, same numbers
    other = client.post("/v1/attention/analyze", json={"shape": [1, 2, 16, 64], "seed": 6}).json()["sweep"]
    assert other != sweep


def test_head_dims_sweep_shows_the_sqrt_dk_growth(client) -> None:
    body = {"shape": [1, 2, 64, 1], "head_dims": [16, 256, 1024], "temperatures": [1.0], "seed": 0}
    r = client.post("/v1/attention/analyze", json=body)
    assert r.status_code == 200, r.text
    sweep = r.json()["sweep"]
    assert [(row["head_dim"], row["scale"]) for row in sweep] == [
        (e, s) for e in (16, 256, 1024) for s in (1.0, 1 / math.sqrt(e))
    ]
    unscaled = [row for row in sweep if row["scale"] == 1.0]
    scaled = [row for row in sweep if row["scale"] != 1.0]
    for row in unscaled:
        assert row["score_std"] == pytest.approx(math.sqrt(row["head_dim"]), rel=0.06)
    assert [row["saturated_fraction"] for row in unscaled] == sorted(row["saturated_fraction"] for row in unscaled)
    assert unscaled[-1]["saturated_fraction"] > 0.1 and unscaled[-1]["vanishing_fraction"] > 0.3
    assert all(row["score_std"] == pytest.approx(1.0, rel=0.06) and row["saturated_fraction"] == 0 for row in scaled)


def test_sent_inputs_with_masks_match_the_core(client) -> None:
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((2, 4, 5, 8)), rng.standard_normal((2, 2, 6, 8))
    mask = rng.standard_normal((1, 1, 5, 6))
    body = {
        "query": b64(q),
        "key": k.tolist(),
        "mask": mask.tolist(),
        "causal": "bottom_right",
        "key_lengths": [6, 4],
        "normalizer": "entmax",
        "alpha": 1.6,
        "scales": [0.5, 2.0],
        "temperatures": [1.5],
        "vanishing_threshold": 0.05,
    }
    r = client.post("/v1/attention/analyze", json=body)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["seed"] is None and got["shape"] == [2, 4, 5, 6] and got["kv_heads"] == 2
    want = analyze(
        q,
        k,
        points=sweep_points([8], [0.5, 2.0], [1.5]),
        normalizer="entmax",
        alpha=1.6,
        mask=mask,
        causal="bottom_right",
        key_lengths=np.array([6, 4]),
        vanishing_threshold=0.05,
    )
    assert got["sweep"] == [w.as_dict() for w in want]


@pytest.mark.parametrize(
    "body,loc",
    [
        ({"shape": [1, 2, 4, 8], "query": [[1.0]]}, ["query"]),
        ({}, ["query"]),
        ({"query": [[1.0, 2.0]]}, ["key"]),
        ({"query": [[1.0, 2.0]], "key": [[1.0, 2.0]], "head_dims": [4]}, ["head_dims"]),
        ({"query": [[1.0, 2.0]], "key": [[1.0, 2.0, 3.0]]}, ["key", "shape", 1]),
        ({"shape": [1, 2, 4]}, ["shape"]),
        ({"shape": [1, 2, 0, 4]}, ["shape", 2]),
        ({"shape": [1, 2, 4, 8], "distribution": "uniform"}, ["distribution"]),
        ({"shape": [1, 2, 4, 8], "scales": [1.0, -1.0]}, ["scales", 1]),
        ({"shape": [1, 2, 4, 8], "scales": [1.0] * 17}, ["scales"]),
        ({"shape": [1, 2, 4, 8], "temperatures": []}, ["temperatures"]),
        ({"shape": [1, 2, 4, 8], "alpha": 1.5}, ["alpha"]),
        ({"shape": [1, 2, 4, 8], "normalizer": "entmax"}, ["alpha"]),
        ({"shape": [1, 2, 4, 8], "mask": [[True, False]]}, ["mask", "shape", 1]),
        ({"shape": [2, 2, 4, 8], "key_lengths": [1]}, ["key_lengths"]),
        ({"shape": [1, 2, 4, 8], "vanishing_threshold": -1}, ["vanishing_threshold"]),
        ({"shape": [1, 2, 4, 8], "seed": -1}, ["seed"]),
        ({"shape": [1, 2, 4, 8], "bogus": 1}, ["bogus"]),
        ({"shape": [1, 2, 4, 100000]}, ["shape", 3]),
        ({"query": b64(np.array([[np.nan, 1.0]])), "key": [[1.0, 2.0]]}, ["query", 0, 0]),
    ],
)
def test_bad_inputs_are_422_naming_the_field(client, body: dict, loc: list) -> None:
    assert_problem(client.post("/v1/attention/analyze", json=body), 422, loc=loc)


def test_drawn_shapes_are_bounded_with_413() -> None:
    settings = Settings(enable_onnx=False, max_work_flops=1e8, max_tensor_elements=1 << 16)
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        assert c.post("/v1/attention/analyze", json={"shape": [1, 1, 32, 16]}).status_code == 200
        assert_problem(c.post("/v1/attention/analyze", json={"shape": [64, 64, 64, 64]}), 413, detail="elements")
        assert_problem(
            c.post("/v1/attention/analyze", json={"shape": [1, 1, 16, 4], "head_dims": [4, 8, 16, 8192]}),
            413,
            detail="elements",
        )
        assert_problem(c.post("/v1/attention/analyze", json={"shape": [1, 8, 512, 8]}), 413, detail="estimated work")
