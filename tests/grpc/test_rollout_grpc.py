"""The model ``attention_rollout`` over gRPC with Triton's client against a live server: the golden cases hold, the
numbers equal /v1's and /v2's over REST, and refusals are INVALID_ARGUMENT and RESOURCE_EXHAUSTED naming the field.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from tests.golden import load
from tests.grpc.conftest import GrpcServer
from tests.grpc.test_tritonclient import grpc_inputs, rest_inputs

pytestmark = pytest.mark.slow

CASES = load("rollout")
DATATYPE = {np.dtype(np.float16): "FP16", np.dtype(np.float32): "FP32", np.dtype(np.float64): "FP64"}
DATATYPE[np.dtype(np.int32)] = "INT32"


@pytest.fixture(scope="module")
def clients(server: GrpcServer) -> Iterator[tuple[tg.InferenceServerClient, th.InferenceServerClient]]:
    over_grpc = tg.InferenceServerClient(server.target)
    over_rest = th.InferenceServerClient(server.url.removeprefix("http://"))
    yield over_grpc, over_rest
    over_grpc.close()
    over_rest.close()


def inputs(module: Any, arrays: dict[str, np.ndarray]) -> list[Any]:
    """``arrays`` as the client's inputs (FP16 and INT32 too, which the shared helpers do not name)."""
    if module is tg and all(a.dtype in (np.float32, np.float64) for a in arrays.values()):
        return grpc_inputs(arrays)
    if module is th and all(a.dtype in (np.float32, np.float64) for a in arrays.values()):
        return rest_inputs(arrays)
    made = []
    for name, arr in arrays.items():
        t = module.InferInput(name, list(arr.shape), DATATYPE[arr.dtype])
        if module is th:
            t.set_data_from_numpy(arr, binary_data=True)
        else:
            t.set_data_from_numpy(arr)
        made.append(t)
    return made


def infer(client: Any, module: Any, arrays: dict[str, np.ndarray], **parameters: Any) -> np.ndarray:
    if module is th:
        outputs = [th.InferRequestedOutput("rollout", binary_data=True)]
    else:
        outputs = [tg.InferRequestedOutput("rollout")]
    result = client.infer("attention_rollout", inputs(module, arrays), outputs=outputs, parameters=parameters)
    out: np.ndarray = result.as_numpy("rollout")
    return out


@pytest.mark.parametrize("i", range(0, len(CASES), 3))
def test_golden_cases_over_grpc_and_rest(
    server: GrpcServer, clients: tuple[tg.InferenceServerClient, th.InferenceServerClient], i: int
) -> None:
    case = CASES[i]
    dtype = np.dtype(case["dtype"])
    arrays = {n: np.array(case[n], dtype=dtype) for n in ("weights", "gradients") if case[n] is not None}
    options = {"head_fusion": case["head_fusion"], "discard_ratio": case["discard_ratio"]}
    over_grpc = infer(clients[0], tg, arrays, **options)
    tol = 1e-12 if dtype == np.float64 else 1e-6
    np.testing.assert_allclose(over_grpc, np.array(case["expected"]), rtol=tol, atol=tol)
    np.testing.assert_array_equal(infer(clients[1], th, arrays, **options), over_grpc)
    body = {n: a.tolist() for n, a in arrays.items()}
    v1 = httpx.post(f"{server.url}/v1/attention/rollout", json={**body, **options, "precision": dtype.name}).json()
    np.testing.assert_array_equal(np.array(v1["rollout"], dtype=dtype), over_grpc)


def test_rows_float16_and_int32_over_grpc(clients: tuple[tg.InferenceServerClient, th.InferenceServerClient]) -> None:
    case = CASES[4]
    weights = np.array(case["weights"])
    full = infer(clients[0], tg, {"weights": weights})
    rows = np.array([-1, 0], dtype=np.int32)
    got = infer(clients[0], tg, {"weights": weights, "rows": rows})
    np.testing.assert_array_equal(got, full[:, [-1, 0]])
    half = infer(clients[0], tg, {"weights": weights.astype(np.float16)})
    assert half.dtype == np.float32
    np.testing.assert_array_equal(half, infer(clients[1], th, {"weights": weights.astype(np.float16)}))


def test_refusals_are_invalid_argument_naming_the_field(
    clients: tuple[tg.InferenceServerClient, th.InferenceServerClient],
) -> None:
    weights = np.array(CASES[0]["weights"])
    bad = weights.copy()
    bad[0, 0, 2, 3, 1] = -1.0
    for arrays, params, words in (
        ({"weights": bad}, {}, "weights[0, 0, 2, 3, 1] (layer 0, batch 0, head 2, row 3) = -1.0 is negative"),
        ({"weights": weights, "rows": np.array([5], dtype=np.int32)}, {}, "rows[0] = 5 is out of range"),
        ({"weights": weights}, {"residual": 3}, "parameter 'residual'"),
        ({"weights": weights[0]}, {}, "weights has rank 4"),
    ):
        with pytest.raises(InferenceServerException, match=re.escape(words)) as err:
            infer(clients[0], tg, arrays, **params)
        assert err.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_too_large_is_resource_exhausted_naming_top_k_and_rows(server_with: Callable[..., GrpcServer]) -> None:
    small = server_with(ATTN_MAX_RESPONSE_BYTES="8192")
    client = tg.InferenceServerClient(small.target)
    logits = np.random.default_rng(0).standard_normal((1, 1, 1, 64, 64))
    weights = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)
    with pytest.raises(
        InferenceServerException, match=r"send top_k to have only each row's k largest .* or rows"
    ) as err:
        infer(client, tg, {"weights": weights})
    assert err.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert infer(client, tg, {"weights": weights, "rows": np.array([0], dtype=np.int32)}).shape == (1, 1, 64)
    client.close()


def test_top_k_over_grpc_answers_int64_keys_and_their_values(
    clients: tuple[tg.InferenceServerClient, th.InferenceServerClient],
) -> None:
    weights = np.array(CASES[4]["weights"])
    whole = infer(clients[0], tg, {"weights": weights})
    outputs = [tg.InferRequestedOutput("top_keys"), tg.InferRequestedOutput("top_values")]
    result = clients[0].infer(
        "attention_rollout", inputs(tg, {"weights": weights}), outputs=outputs, parameters={"top_k": 2}
    )
    keys, values = result.as_numpy("top_keys"), result.as_numpy("top_values")
    assert keys.dtype == np.int64 and keys.shape == (*whole.shape[:2], 2)
    want = np.argsort(-whole, axis=-1, kind="stable")[..., :2]
    np.testing.assert_array_equal(keys, want)
    np.testing.assert_array_equal(values, np.take_along_axis(whole, want, axis=-1))
    with pytest.raises(InferenceServerException, match="top_k 99 is outside") as err:
        clients[0].infer("attention_rollout", inputs(tg, {"weights": weights}), parameters={"top_k": 99})
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
