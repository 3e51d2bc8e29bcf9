"""No body a client can send makes the API answer 5xx, hang, or return NaN."""

from __future__ import annotations

import json
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=30,
)
numbers = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)


def matrix(rows: int, cols: int):
    return st.lists(st.lists(numbers, min_size=cols, max_size=cols), min_size=rows, max_size=rows)


fields = {
    "query": json_values | matrix(2, 3),
    "key": json_values | matrix(3, 3),
    "value": json_values | matrix(3, 2),
    "mask": json_values | st.lists(st.lists(st.booleans(), min_size=3, max_size=3), min_size=2, max_size=2),
    "causal": json_values | st.sampled_from([True, False, "top_left", "bottom_right"]),
    "key_lengths": json_values | st.lists(st.integers(-2, 5), max_size=2),
    "scale": json_values | numbers,
    "temperature": json_values | numbers,
    "normalizer": json_values | st.sampled_from(["softmax", "sparsemax", "entmax15", "entmax", "relu"]),
    "alpha": json_values | st.floats(0, 4),
    "engine": st.sampled_from(["auto", "numpy", "onnx", "x"]),
    "precision": st.sampled_from(["float32", "float64", "float16"]),
    "return": json_values | st.lists(st.sampled_from(["output", "weights", "scores", "diagnostics"]), max_size=4),
    "encoding": st.sampled_from(["json", "base64", "hex"]),
}
bodies = st.fixed_dictionaries(
    {k: fields[k] for k in ("query", "key", "value")},
    optional={k: v for k, v in fields.items() if k not in ("query", "key", "value")},
)


def _no_nan(obj) -> None:
    if isinstance(obj, float):
        assert math.isfinite(obj)
    elif isinstance(obj, list):
        for x in obj:
            _no_nan(x)
    elif isinstance(obj, dict):
        for k, x in obj.items():
            if k != "scores":  # masked scores are null by design; everything else is finite
                _no_nan(x)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(bodies)
def test_attention_never_500(client, body: dict) -> None:
    r = client.post("/v1/attention", content=json.dumps(body), headers={"content-type": "application/json"})
    assert r.status_code in (200, 413, 422), r.text
    payload = r.json()
    if r.status_code == 200:
        _no_nan(payload)
    else:
        assert payload["status"] == r.status_code and payload["detail"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(json_values)
def test_arbitrary_json_never_500(client, body) -> None:
    for path in ("/v1/attention", "/v1/softmax"):
        r = client.post(path, content=json.dumps(body), headers={"content-type": "application/json"})
        assert r.status_code == 422, r.text


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.fixed_dictionaries(
        {"logits": json_values | matrix(2, 3)},
        optional={k: fields[k] for k in ("mask", "temperature", "normalizer", "alpha", "encoding")}
        | {"axis": st.integers(-3, 3) | json_values, "log": json_values},
    )
)
def test_softmax_never_500(client, body: dict) -> None:
    r = client.post("/v1/softmax", content=json.dumps(body), headers={"content-type": "application/json"})
    assert r.status_code in (200, 422), r.text
    if r.status_code == 200:
        _no_nan({k: v for k, v in r.json().items() if k != "log_probabilities"})
