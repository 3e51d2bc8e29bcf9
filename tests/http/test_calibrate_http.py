"""POST /v1/calibrate: golden cases over HTTP, the reliability bins, and bad inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests import golden
from tests.http.conftest import assert_problem
from tests.http.test_attention_http import b64

CASES = golden.load("calibrate")


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
@pytest.mark.parametrize("form", ["lists", "b64"])
def test_golden(client, case, form: str) -> None:
    req = dict(case["request"])
    if form == "b64":
        req["logits"] = b64(req["logits"], "float64")
    r = client.post("/v1/calibrate", json=req)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["temperature"] == pytest.approx(case["temperature"], rel=1e-6)
    assert out["bounded"] is False
    for key in ("nll", "ece"):
        assert out[key]["before"] == pytest.approx(case[key]["before"], abs=1e-12)
        assert out[key]["after"] == pytest.approx(case[key]["after"], abs=1e-7)
    assert out["accuracy"] == pytest.approx(case["accuracy"], abs=1e-15)
    for when in ("before", "after"):
        bins = out["reliability"][when]
        assert len(bins) == req["bins"]
        assert sum(b["count"] for b in bins) == len(req["labels"])
        assert bins[0]["lower"] == 0 and bins[-1]["upper"] == 1
        for b in bins:
            if b["count"]:
                assert b["lower"] < b["confidence"] <= b["upper"] and 0 <= b["accuracy"] <= 1
            else:
                assert b["confidence"] is None and b["accuracy"] is None
        weighted = sum(b["count"] * abs(b["accuracy"] - b["confidence"]) for b in bins if b["count"])
        assert weighted / len(req["labels"]) == pytest.approx(out["ece"][when], abs=1e-12)


def test_defaults_and_bounded(client) -> None:
    z = np.random.default_rng(0).standard_normal((50, 3))
    out = client.post("/v1/calibrate", json={"logits": z.tolist(), "labels": np.argmax(z, 1).tolist()}).json()
    assert out["temperature"] == 0.01 and out["bounded"] is True and out["accuracy"] == 1.0
    assert len(out["reliability"]["before"]) == 15
    assert set(out["timing_ms"]) >= {"decode", "compute", "total"}


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"logits": [[1.0, 2.0], [3.0, 4.0]], "labels": [0, 2]}, ["labels", 1]),
        ({"logits": [[1.0, 2.0], [3.0, 4.0]], "labels": [-1, 0]}, ["labels", 0]),
        ({"logits": [[1.0, 2.0], [3.0, 4.0]], "labels": [0]}, ["labels"]),
        ({"logits": [[1.0, 2.0]], "labels": []}, ["labels"]),
        ({"logits": [], "labels": []}, ["logits"]),
        ({"logits": b64([[1.0, 2.0], [math.inf, 0.0]]), "labels": [0, 1]}, ["logits", 1, 0]),
        ({"logits": b64([[1.0, 2.0], [0.0, math.nan]]), "labels": [0, 1]}, ["logits", 1, 1]),
        ({"logits": [[1.0], [2.0]], "labels": [0, 0]}, ["logits", "shape", 1]),
        ({"logits": [1.0, 2.0], "labels": [0]}, ["logits"]),
        ({"logits": [[1.0, 2.0]], "labels": [0.5]}, ["labels", 0]),
        ({"logits": [[1.0, 2.0]], "labels": [0], "method": "platt"}, ["method"]),
        ({"logits": [[1.0, 2.0]], "labels": [0], "bins": 0}, ["bins"]),
        ({"logits": [[1.0, 2.0]]}, ["labels"]),
        ({"logits": [[1.0, 2.0]], "labels": [0], "T": 1}, ["T"]),
    ],
    ids=lambda v: str(v)[:50],
)
def test_bad_input_is_422_with_the_place(client, body, loc) -> None:
    r = client.post("/v1/calibrate", json=body)
    assert_problem(r, 422, loc=loc)
