"""Triton's statistics extension on a live server (issue 28, item 5): tritonclient's
``get_inference_statistics()`` over REST and gRPC counts exactly the inference requests sent, successes and
failures apart, with their cumulative times, where both answered "this server does not support the statistics
extension" (REST 404, gRPC UNIMPLEMENTED). Each test has a model of its own, so its counts start at zero.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from service.dataplane.models import MODELS
from tests.grpc.conftest import GrpcServer, grpc_server

pytestmark = pytest.mark.slow  # a live server

PHASES = ("queue", "compute_input", "compute_infer", "compute_output")
LOGITS = np.array([[2.0, 0.5, -1.0, 3.0]], dtype=np.float32)
QKV = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)


@pytest.fixture(scope="module")
def fresh() -> Iterator[GrpcServer]:
    """A server of this module's own: no other test's requests in its counts."""
    with grpc_server() as s:
        yield s


def http_client(server: GrpcServer) -> th.InferenceServerClient:
    return th.InferenceServerClient(server.url.removeprefix("http://"))


def softmax_inputs(module: Any) -> list[Any]:
    t = module.InferInput("logits", list(LOGITS.shape), "FP32")
    t.set_data_from_numpy(LOGITS)
    return [t]


def attention_inputs(module: Any) -> list[Any]:
    inputs = []
    for name in ("query", "key", "value"):
        t = module.InferInput(name, list(QKV.shape), "FP32")
        t.set_data_from_numpy(QKV)
        inputs.append(t)
    return inputs


def send(client: Any, model: str, inputs: list[Any], ok: int, failed: int) -> None:
    """``ok`` inferences that succeed, then ``failed`` that the model refuses (a parameter it does not have)."""
    for _ in range(ok):
        client.infer(model, inputs)
    for _ in range(failed):
        with pytest.raises(InferenceServerException, match="has no parameter 'bogus'"):
            client.infer(model, inputs, parameters={"bogus": 1})


def check(stats: dict[str, Any], name: str, ok: int, failed: int, since_ms: int) -> None:
    """One model's entry: Triton's shape, exactly ``ok`` successes and ``failed`` failures, positive times."""
    assert stats["name"] == name and stats["version"] == "1"
    assert int(stats["inference_count"]) == int(stats["execution_count"]) == ok
    assert since_ms <= int(stats["last_inference"]) <= time.time() * 1e3 + 1
    inference = stats["inference_stats"]  # over gRPC (protobuf's JSON) a uint64 is a string, and a 0 left out
    counts = {k: int(inference[k].get("count", 0)) for k in ("success", "fail", *PHASES)}
    ns = {k: int(inference[k].get("ns", 0)) for k in ("success", "fail", *PHASES)}
    assert counts == {"success": ok, "fail": failed, **dict.fromkeys(PHASES, ok)}, inference
    assert all(ns[k] > 0 for k in ("success", "fail", "compute_input", "compute_infer", "compute_output")), ns
    assert ns["queue"] >= 0
    assert ns["success"] >= sum(ns[k] for k in PHASES) - len(PHASES), ns  # the phases are parts of the whole
    assert not stats.get("batch_stats")


def test_tritonclient_http_counts_successes_and_failures(fresh: GrpcServer) -> None:
    client = http_client(fresh)
    since = int(time.time() * 1e3)
    send(client, "softmax", softmax_inputs(th), ok=5, failed=3)
    stats = client.get_inference_statistics("softmax")
    assert len(stats["model_stats"]) == 1
    check(stats["model_stats"][0], "softmax", 5, 3, since)
    assert client.get_inference_statistics("softmax", "1") == stats  # the version's: the same numbers
    inference = stats["model_stats"][0]["inference_stats"]
    assert inference["cache_hit"] == inference["cache_miss"] == {"count": 0, "ns": 0}  # no response cache


def test_tritonclient_grpc_counts_successes_and_failures(fresh: GrpcServer) -> None:
    client = tg.InferenceServerClient(fresh.target)
    since = int(time.time() * 1e3)
    send(client, "attention", attention_inputs(tg), ok=4, failed=2)
    stats = client.get_inference_statistics("attention", as_json=True)
    assert len(stats["model_stats"]) == 1
    check(stats["model_stats"][0], "attention", 4, 2, since)
    assert client.get_inference_statistics("attention", "1", as_json=True) == stats
    client.close()


def test_both_protocols_count_into_the_same_numbers(fresh: GrpcServer) -> None:
    """REST and gRPC requests of one model count together, and both protocols read the same totals."""
    rest, over_grpc = http_client(fresh), tg.InferenceServerClient(fresh.target)
    since = int(time.time() * 1e3)
    send(rest, "attention_backward", attention_inputs(th) + grad_output(th), ok=2, failed=1)
    send(over_grpc, "attention_backward", attention_inputs(tg) + grad_output(tg), ok=3, failed=0)
    over_rest = rest.get_inference_statistics("attention_backward")["model_stats"][0]
    check(over_rest, "attention_backward", 5, 1, since)
    got = over_grpc.get_inference_statistics("attention_backward", as_json=True)["model_stats"][0]
    assert int(got["inference_stats"]["success"]["ns"]) == over_rest["inference_stats"]["success"]["ns"]
    over_grpc.close()


def grad_output(module: Any) -> list[Any]:
    t = module.InferInput("grad_output", list(QKV.shape), "FP32")
    t.set_data_from_numpy(QKV)
    return [t]


def test_every_model_when_no_name_is_given(fresh: GrpcServer) -> None:
    every = http_client(fresh).get_inference_statistics()["model_stats"]
    assert [m["name"] for m in every] == list(MODELS)
    calibrate = next(m for m in every if m["name"] == "calibrate")  # no test sends it a request
    assert calibrate["inference_count"] == calibrate["last_inference"] == 0
    assert all(v == {"count": 0, "ns": 0} for v in calibrate["inference_stats"].values())
    over_grpc = tg.InferenceServerClient(fresh.target)
    assert [m["name"] for m in over_grpc.get_inference_statistics(as_json=True)["model_stats"]] == list(MODELS)
    over_grpc.close()


def test_an_unknown_model_or_version_is_not_found(fresh: GrpcServer) -> None:
    rest, over_grpc = http_client(fresh), tg.InferenceServerClient(fresh.target)
    for name, version, words in (("nope", "", "unknown model 'nope'"), ("softmax", "2", "has no version '2'")):
        with pytest.raises(InferenceServerException, match=words) as err:
            rest.get_inference_statistics(name, version)
        assert err.value.status() == "404"
        with pytest.raises(InferenceServerException, match=words) as err:
            over_grpc.get_inference_statistics(name, version)
        assert err.value.status() == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException, match="the models have no version '2'") as err:
        over_grpc.get_inference_statistics("", "2")
    assert err.value.status() == "StatusCode.NOT_FOUND"
    over_grpc.close()


def test_server_metadata_lists_the_extension(fresh: GrpcServer) -> None:
    assert "statistics" in http_client(fresh).get_server_metadata()["extensions"]
    assert "statistics" in tg.InferenceServerClient(fresh.target).get_server_metadata().extensions


def test_queue_is_the_wait_for_a_compute_slot(server_with: Callable[..., GrpcServer]) -> None:
    """One compute slot, every request in a worker thread: of four sent at once, three wait for the slot."""
    server = server_with(ATTN_MAX_CONCURRENT_REQUESTS="1", ATTN_INLINE_MAX_BODY_BYTES="0")
    q = np.random.default_rng(0).standard_normal((1, 4, 256, 64)).astype(np.float32)

    def one(_: int) -> None:
        client = http_client(server)
        inputs = []
        for name in ("query", "key", "value"):
            t = th.InferInput(name, list(q.shape), "FP32")
            t.set_data_from_numpy(q, binary_data=True)
            inputs.append(t)
        client.infer("attention", inputs)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, range(4)))
    stats = http_client(server).get_inference_statistics("attention")["model_stats"][0]["inference_stats"]
    assert stats["queue"]["count"] == stats["success"]["count"] == 4
    assert stats["queue"]["ns"] > 0 and stats["success"]["ns"] > stats["queue"]["ns"]
