"""POST /v1/softmax: the contract's reference numbers over HTTP, masks, axis and errors."""

from __future__ import annotations

import numpy as np
import pytest

from tests.http.conftest import assert_problem
from tests.http.test_attention_http import b64, decode

ROWS = [[1.0, 0.5, 2.5, -0.1], [2.1, 0.5, -1.2, 3.0], [1.8, -0.3, 2.5, 0.1]]
TABLE = {
    "softmax": [[0.1557, 0.0945, 0.6980, 0.0518], [0.2704, 0.0546, 0.0100, 0.6650], [0.3013, 0.0369, 0.6068, 0.0550]],
    "sparsemax": [[0, 0, 1, 0], [0.05, 0, 0, 0.95], [0.15, 0, 0.85, 0]],
    "entmax15": [[0.0504, 0, 0.9496, 0], [0.1983, 0, 0, 0.8017], [0.2602, 0, 0.7398, 0]],
}


@pytest.mark.parametrize("normalizer", sorted(TABLE))
def test_reference_table(client, normalizer: str) -> None:
    r = client.post("/v1/softmax", json={"logits": ROWS, "normalizer": normalizer, "precision": "float64"})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json()["probabilities"], TABLE[normalizer], atol=1e-4)


def test_alpha_entmax_equals_sparsemax_at_two(client) -> None:
    r = client.post("/v1/softmax", json={"logits": ROWS, "normalizer": "entmax", "alpha": 2.0, "precision": "float64"})
    np.testing.assert_allclose(r.json()["probabilities"], TABLE["sparsemax"], atol=1e-4)


def test_log_softmax_temperature_relu_and_entropy(client) -> None:
    body = client.post("/v1/softmax", json={"logits": ROWS, "log": True, "precision": "float64"}).json()
    np.testing.assert_allclose(body["log_probabilities"][1], [-1.3079, -2.9079, -4.6079, -0.4079], atol=1e-4)
    np.testing.assert_allclose(body["diagnostics"]["entropy"], [0.9169, 0.8296, 0.9460], atol=1e-4)
    assert body["diagnostics"]["argmax"] == [2, 3, 2]
    hot = client.post("/v1/softmax", json={"logits": ROWS[1:], "temperature": 2, "precision": "float64"}).json()
    np.testing.assert_allclose(
        hot["probabilities"], [[0.3116, 0.1400, 0.0598, 0.4886], [0.3128, 0.1095, 0.4440, 0.1337]], atol=1e-4
    )
    relu = client.post("/v1/softmax", json={"logits": ROWS[1:], "normalizer": "relu", "precision": "float64"}).json()
    np.testing.assert_allclose(
        relu["probabilities"], [[0.375, 0.0893, 0, 0.5357], [0.4091, 0, 0.5682, 0.0227]], atol=1e-4
    )


def test_axis_mask_and_base64(client) -> None:
    logits = np.array(ROWS).T  # normalize over axis 0 instead
    mask = np.ones_like(logits, dtype=bool)
    mask[:, 0] = False  # first column fully masked
    r = client.post(
        "/v1/softmax", json={"logits": b64(logits), "axis": 0, "mask": mask.tolist(), "encoding": "base64", "log": True}
    )
    body = r.json()
    p = decode(body["probabilities"])
    assert p.dtype == np.float32 and p.shape == (4, 3)
    assert np.all(p[:, 0] == 0)
    np.testing.assert_allclose(p[:, 1], TABLE["softmax"][1], atol=1e-4)
    assert np.isneginf(decode(body["log_probabilities"])[:, 0]).all()


@pytest.mark.parametrize(
    "patch,loc",
    [
        ({"axis": 2}, ["axis"]),
        ({"log": True, "normalizer": "sparsemax"}, ["log"]),
        ({"logits": [[True, False]]}, ["logits", 0, 0]),
        ({"mask": [[True, False]]}, ["mask", "shape"]),
        ({"alpha": 1.5}, ["alpha"]),
        ({"temperature": 3.48e-273}, ["logits"]),  # 1/T overflows float32: a 422, not NaN
    ],
)
def test_softmax_errors(client, patch: dict, loc: list) -> None:
    body = {"logits": ROWS}
    body.update(patch)
    assert_problem(client.post("/v1/softmax", json=body), 422, loc=loc)
