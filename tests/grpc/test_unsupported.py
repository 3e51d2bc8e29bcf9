"""The protocol's extensions this server does not serve (issue 28, item 7): the same clear answer on both
protocols, naming the extension (REST 404 with the protocol's error body, gRPC UNIMPLEMENTED), where REST gave a
bare ``{"error": "Not Found"}`` and gRPC "Method not found!". Statistics, served since item 5: test_statistics.py.
"""

from __future__ import annotations

import grpc
import httpx
import pytest

from service.dataplane.models.unsupported import UNSUPPORTED
from tests.grpc.conftest import GrpcServer

pytestmark = pytest.mark.slow  # a live server

CASES = [
    (extension.name, method, path.format(model_name="attention", model_version="1", region_name="r0"))
    for extension in UNSUPPORTED
    for method, path in extension.rest
]


@pytest.mark.parametrize(("extension", "method", "path"), CASES, ids=[f"{m} {p}" for _, m, p in CASES])
def test_rest_names_the_extension(server: GrpcServer, extension: str, method: str, path: str) -> None:
    response = httpx.request(method, server.url + "/v2" + path, json={}, timeout=10)
    assert response.status_code == 404, response.text
    assert response.json() == {
        "error": f"this server does not support the {extension} extension of the Open Inference Protocol; "
        + next(e.instead for e in UNSUPPORTED if e.name == extension)
    }


def test_grpc_names_the_extension_and_tritonclient_sees_it(server: GrpcServer) -> None:
    with grpc.insecure_channel(server.target) as channel:
        for extension in UNSUPPORTED:
            for name in extension.grpc:
                call = channel.unary_unary(f"/inference.GRPCInferenceService/{name}")
                with pytest.raises(grpc.RpcError) as err:
                    call(b"", timeout=10)
                assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED, (name, err.value)
                assert err.value.details() == extension.message(), name
    import tritonclient.grpc as tg
    from tritonclient.utils import InferenceServerException

    client = tg.InferenceServerClient(server.target)
    with pytest.raises(InferenceServerException, match="model repository extension"):
        client.get_model_repository_index()
    with pytest.raises(InferenceServerException, match="model configuration extension"):
        client.get_model_config("attention")


def test_the_models_still_answer(server: GrpcServer) -> None:
    assert httpx.get(server.url + "/v2/models/attention").json()["name"] == "attention"
    response = httpx.get(server.url + "/v2/models/nope")
    assert response.status_code == 404 and response.json()["error"].startswith("unknown model 'nope'")
